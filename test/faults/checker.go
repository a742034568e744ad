package faults

import (
	"cmp"
	"fmt"
	"math/big"
	"time"
)

// Committed is an outbox row whose transaction committed: what a producer
// recorded after COMMIT succeeded.
type Committed struct {
	ID        string
	CreatedAt time.Time
	Key       string // the key column's value, for ordering PerKey ("" without one)
}

// Report is the checker's verdict on one run.
type Report struct {
	Committed  int // rows committed by the producers
	Delivered  int // stream entries, duplicates included
	Lost       int // committed ids with no stream entry
	Duplicates int // stream entries beyond the first for their id
	// Reordered counts first deliveries whose (created_at, id) is lower
	// than that of an earlier first delivery. Only a single relay without
	// faults promises order; elsewhere it is a figure, not a failure.
	Reordered int
	// Unexpected counts stream entries whose id no producer committed.
	Unexpected int
	// LostIDs and DuplicateIDs name up to ten of each, for the failure message.
	LostIDs, DuplicateIDs []string
}

func (r Report) String() string {
	return fmt.Sprintf("committed=%d delivered=%d lost=%d duplicates=%d reordered=%d unexpected=%d",
		r.Committed, r.Delivered, r.Lost, r.Duplicates, r.Reordered, r.Unexpected)
}

// maxNamed bounds LostIDs and DuplicateIDs.
const maxNamed = 10

// Check compares the committed rows with the event ids of the stream in
// stream order. It is a pure function.
func Check(committed []Committed, delivered []string) Report {
	r := Report{Committed: len(committed), Delivered: len(delivered)}
	created := make(map[string]time.Time, len(committed))
	for _, c := range committed {
		created[c.ID] = c.CreatedAt
	}
	seen := make(map[string]int, len(delivered))
	var last *Committed // highest (created_at, id) delivered so far
	for _, id := range delivered {
		seen[id]++
		if seen[id] > 1 {
			r.Duplicates++
			if seen[id] == 2 && len(r.DuplicateIDs) < maxNamed {
				r.DuplicateIDs = append(r.DuplicateIDs, id)
			}
			continue
		}
		at, ok := created[id]
		if !ok {
			r.Unexpected++
			continue
		}
		cur := Committed{ID: id, CreatedAt: at}
		if last != nil && compareRows(cur, *last) < 0 {
			r.Reordered++
			continue
		}
		last = &cur
	}
	for _, c := range committed {
		if seen[c.ID] == 0 {
			r.Lost++
			if len(r.LostIDs) < maxNamed {
				r.LostIDs = append(r.LostIDs, c.ID)
			}
		}
	}
	return r
}

// compareRows orders rows as the relay claims them: by created_at, ties by
// id, numerically when both ids are integers.
func compareRows(a, b Committed) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	x, okX := new(big.Int).SetString(a.ID, 10)
	y, okY := new(big.Int).SetString(b.ID, 10)
	if okX && okY {
		return x.Cmp(y)
	}
	return cmp.Compare(a.ID, b.ID)
}
