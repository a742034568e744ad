package faults

import "fmt"

// Entry is one stream entry as the order checker needs it: the event id and,
// for ordering PerKey, the entry's key field ("" when it has none).
type Entry struct {
	EventID string
	Key     string
}

// OrderReport is the order checker's verdict on one run. It judges the first
// occurrence of each event in the stream, which is what a consumer that
// dedupes on event_id sees.
type OrderReport struct {
	Committed  int // rows committed by the producers
	Delivered  int // stream entries, duplicates included
	Lost       int // committed ids with no stream entry
	Duplicates int // stream entries beyond the first for their id
	// Reorderings counts adjacent pairs of first occurrences, within one
	// group, whose (created_at, id) is out of order: the whole stream is one
	// group when the order is global (Strict), each key is a group when it is
	// per key (PerKey). 0 means every group's first occurrences are sorted.
	Reorderings int
	// Unexpected counts stream entries whose id no producer committed.
	Unexpected int
	// KeyMismatches counts first occurrences whose key field differs from
	// the committed row's key (PerKey only).
	KeyMismatches int
	// Groups is the number of groups that received at least one event.
	Groups int
	// LostIDs, DuplicateIDs and Reordered name up to ten of each, for the
	// failure message; Reordered as "earlier>later" pairs.
	LostIDs, DuplicateIDs, Reordered []string
}

func (r OrderReport) String() string {
	return fmt.Sprintf("committed=%d delivered=%d lost=%d duplicates=%d reorderings=%d unexpected=%d key_mismatches=%d groups=%d",
		r.Committed, r.Delivered, r.Lost, r.Duplicates, r.Reorderings, r.Unexpected, r.KeyMismatches, r.Groups)
}

// Report is the part of the order report that the suite's FIGURES line
// prints (its Reordered figure is the reorderings count).
func (r OrderReport) Report() Report {
	return Report{Committed: r.Committed, Delivered: r.Delivered, Lost: r.Lost, Duplicates: r.Duplicates,
		Reordered: r.Reorderings, Unexpected: r.Unexpected, LostIDs: r.LostIDs, DuplicateIDs: r.DuplicateIDs}
}

// CheckOrder compares the committed rows with the stream's entries in stream
// order. With perKey false the first occurrences must be in (created_at, id)
// order across the whole stream (ordering Strict); with perKey true only
// among the events of one key (ordering PerKey), the key being the committed
// row's. It is a pure function.
func CheckOrder(committed []Committed, entries []Entry, perKey bool) OrderReport {
	r := OrderReport{Committed: len(committed), Delivered: len(entries)}
	rows := make(map[string]Committed, len(committed))
	for _, c := range committed {
		rows[c.ID] = c
	}
	seen := make(map[string]int, len(entries))
	last := map[string]Committed{} // per group, the last first occurrence
	for _, e := range entries {
		seen[e.EventID]++
		if seen[e.EventID] > 1 {
			r.Duplicates++
			if seen[e.EventID] == 2 && len(r.DuplicateIDs) < maxNamed {
				r.DuplicateIDs = append(r.DuplicateIDs, e.EventID)
			}
			continue
		}
		row, ok := rows[e.EventID]
		if !ok {
			r.Unexpected++
			continue
		}
		group := ""
		if perKey {
			group = row.Key
			if e.Key != row.Key {
				r.KeyMismatches++
			}
		}
		prev, ok := last[group]
		if !ok {
			r.Groups++
		} else if compareRows(row, prev) < 0 {
			r.Reorderings++
			if len(r.Reordered) < maxNamed {
				r.Reordered = append(r.Reordered, prev.ID+">"+row.ID)
			}
		}
		last[group] = row
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
