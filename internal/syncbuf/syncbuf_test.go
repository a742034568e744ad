package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestBufferConcurrentWriters(t *testing.T) {
	t.Parallel()
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = fmt.Fprintf(&b, "w%d\n", i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != 800 {
		t.Fatalf("got %d lines, want 800", got)
	}
}
