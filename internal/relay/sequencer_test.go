package relay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSequencerPublishesInTicketOrder(t *testing.T) {
	t.Parallel()
	s := newSequencer()
	ctx := context.Background()
	var mu sync.Mutex
	var order []uint64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 25 {
				ticket, ok := s.acquire(ctx)
				require.True(t, ok)
				s.release() // the next claim may start at once
				if ticket%3 == 0 {
					time.Sleep(time.Millisecond) // a slow claim must not be overtaken
				}
				s.wait(ticket)
				mu.Lock()
				order = append(order, ticket)
				mu.Unlock()
				s.done(ticket)
			}
		})
	}
	wg.Wait()
	require.Len(t, order, 100)
	for i, ticket := range order {
		require.EqualValues(t, i, ticket)
	}
}

func TestSequencerAcquireStopsWithContext(t *testing.T) {
	t.Parallel()
	s := newSequencer()
	_, ok := s.acquire(context.Background())
	require.True(t, ok)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, ok = s.acquire(ctx)
	require.False(t, ok, "the token is taken and ctx is done")
}
