package testenv

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

const (
	nameMaxLen    = 40
	nameSuffixLen = 6 // hex digits
)

// nameSeq makes every Name of this process distinct; it starts at a random value
// so that runs (and test binaries sharing a server) differ too.
var nameSeq atomic.Uint32

func init() {
	var b [4]byte
	_, _ = rand.Read(b[:])
	nameSeq.Store(binary.LittleEndian.Uint32(b[:]))
}

// Name returns a name unique to this test and run, usable as a Redis stream or
// key prefix and as a PostgreSQL identifier: "t_", the test's name in lower case
// (without its Test prefix, other characters as '_', shortened), '_' and six hex
// digits, at most 40 characters of [a-z0-9_]; e.g. "t_relaydrains_3f9a2c" for
// TestRelayDrains. Each call returns a new name.
func Name(t testing.TB) string {
	t.Helper()
	base := sanitizeName(t.Name(), nameMaxLen-len("t_")-1-nameSuffixLen)
	suffix := nameSeq.Add(1) & (1<<(4*nameSuffixLen) - 1)
	return fmt.Sprintf("t_%s_%0*x", base, nameSuffixLen, suffix)
}

// sanitizeName lower-cases testName without its Test/Benchmark/Fuzz/Example
// prefix, turns runs of other characters than [a-z0-9] into one '_', and cuts it
// to maxLen.
func sanitizeName(testName string, maxLen int) string {
	for _, prefix := range []string{"Test", "Benchmark", "Fuzz", "Example"} {
		if rest, ok := strings.CutPrefix(testName, prefix); ok && rest != "" {
			testName = rest
			break
		}
	}
	var b strings.Builder
	underscore := true // no leading '_'
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			underscore = false
		case !underscore:
			b.WriteByte('_')
			underscore = true
		}
	}
	name := b.String()
	if len(name) > maxLen {
		name = name[:maxLen]
	}
	name = strings.TrimRight(name, "_")
	if name == "" {
		name = "x"
	}
	return name
}
