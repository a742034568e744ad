//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"
)

// figures prints a case's figures in one line, the line docs/reliability.md
// quotes, e.g.
//
//	FIGURES kills: events=8000 faults=6 lost=0 duplicates=140 reordered=812 worst_lock=4ms drain=31ms
func figures(t testing.TB, r Report, faults int, extra string) {
	t.Helper()
	line := fmt.Sprintf("FIGURES %s: events=%d faults=%d lost=%d duplicates=%d reordered=%d",
		t.Name(), r.Committed, faults, r.Lost, r.Duplicates, r.Reordered)
	if extra != "" {
		line += " " + extra
	}
	t.Log(line)
}

// ms rounds a duration for the figures.
func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
