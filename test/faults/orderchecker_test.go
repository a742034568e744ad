package faults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckOrder(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// row i is created i ms after t0, with key keys[i] ("" when keys is short).
	rows := func(ids []string, keys ...string) []Committed {
		out := make([]Committed, len(ids))
		for i, id := range ids {
			out[i] = Committed{ID: id, CreatedAt: t0.Add(time.Duration(i) * time.Millisecond)}
			if i < len(keys) {
				out[i].Key = keys[i]
			}
		}
		return out
	}
	ids := func(ids ...string) []string { return ids }
	entries := func(ids ...string) []Entry {
		out := make([]Entry, len(ids))
		for i, id := range ids {
			out[i] = Entry{EventID: id}
		}
		return out
	}
	// keyed returns entries "id:key".
	keyed := func(pairs ...string) []Entry {
		out := make([]Entry, 0, len(pairs)/2)
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, Entry{EventID: pairs[i], Key: pairs[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		committed []Committed
		entries   []Entry
		perKey    bool
		want      OrderReport
	}{
		{name: "empty", want: OrderReport{}},
		{
			name:      "in order",
			committed: rows(ids("1", "2", "3")),
			entries:   entries("1", "2", "3"),
			want:      OrderReport{Committed: 3, Delivered: 3, Groups: 1},
		},
		{
			name:      "lost",
			committed: rows(ids("1", "2", "3")),
			entries:   entries("1", "3"),
			want:      OrderReport{Committed: 3, Delivered: 2, Lost: 1, Groups: 1, LostIDs: []string{"2"}},
		},
		{
			// A batch published but not committed is published again: the
			// duplicates come later, the first occurrences stay in order.
			name:      "a republished run of duplicates keeps the first occurrences in order",
			committed: rows(ids("1", "2", "3", "4", "5")),
			entries:   entries("1", "2", "3", "2", "3", "4", "5"),
			want: OrderReport{Committed: 5, Delivered: 7, Duplicates: 2, Groups: 1,
				DuplicateIDs: []string{"2", "3"}},
		},
		{
			// A failed batch retried after a later one: what Strict forbids.
			name:      "a batch retried after a later one",
			committed: rows(ids("1", "2", "3", "4", "5")),
			entries:   entries("1", "4", "5", "2", "3"),
			want: OrderReport{Committed: 5, Delivered: 5, Reorderings: 1, Groups: 1,
				Reordered: []string{"5>2"}},
		},
		{
			name:      "each adjacent inversion counts",
			committed: rows(ids("1", "2", "3", "4")),
			entries:   entries("4", "3", "2", "1"),
			want: OrderReport{Committed: 4, Delivered: 4, Reorderings: 3, Groups: 1,
				Reordered: []string{"4>3", "3>2", "2>1"}},
		},
		{
			name:      "a duplicate out of order is no reordering",
			committed: rows(ids("1", "2", "3")),
			entries:   entries("1", "2", "1", "3"),
			want:      OrderReport{Committed: 3, Delivered: 4, Duplicates: 1, Groups: 1, DuplicateIDs: []string{"1"}},
		},
		{
			name:      "unexpected entries are not ordered",
			committed: rows(ids("1", "2")),
			entries:   entries("1", "x", "2"),
			want:      OrderReport{Committed: 2, Delivered: 3, Unexpected: 1, Groups: 1},
		},
		{
			name: "ties on created_at by numeric id",
			committed: []Committed{
				{ID: "9", CreatedAt: t0}, {ID: "10", CreatedAt: t0},
			},
			entries: entries("10", "9"),
			want: OrderReport{Committed: 2, Delivered: 2, Reorderings: 1, Groups: 1,
				Reordered: []string{"10>9"}},
		},
		{
			name: "ties on created_at by uuid, as PostgreSQL compares uuids",
			committed: []Committed{
				{ID: "0a6b2c7e-0000-4000-8000-000000000000", CreatedAt: t0},
				{ID: "f01d2c7e-0000-4000-8000-000000000000", CreatedAt: t0},
			},
			entries: entries("0a6b2c7e-0000-4000-8000-000000000000", "f01d2c7e-0000-4000-8000-000000000000"),
			want:    OrderReport{Committed: 2, Delivered: 2, Groups: 1},
		},
		{
			// Keys interleave freely; within a key the order holds.
			name:      "per key: keys interleaved, each in order",
			committed: rows(ids("1", "2", "3", "4"), "a", "b", "a", "b"),
			entries:   keyed("2", "b", "1", "a", "4", "b", "3", "a"),
			perKey:    true,
			want:      OrderReport{Committed: 4, Delivered: 4, Groups: 2},
		},
		{
			name:      "the same stream judged globally",
			committed: rows(ids("1", "2", "3", "4"), "a", "b", "a", "b"),
			entries:   keyed("2", "b", "1", "a", "4", "b", "3", "a"),
			want: OrderReport{Committed: 4, Delivered: 4, Reorderings: 2, Groups: 1,
				Reordered: []string{"2>1", "4>3"}},
		},
		{
			name:      "per key: one key out of order",
			committed: rows(ids("1", "2", "3", "4", "5"), "a", "b", "a", "b", "a"),
			entries:   keyed("1", "a", "2", "b", "5", "a", "4", "b", "3", "a"),
			perKey:    true,
			want: OrderReport{Committed: 5, Delivered: 5, Reorderings: 1, Groups: 2,
				Reordered: []string{"5>3"}},
		},
		{
			// The group is the committed row's key; a wrong key field is
			// counted on its own.
			name:      "per key: the entry's key differs from the row's",
			committed: rows(ids("1", "2"), "a", "a"),
			entries:   keyed("1", "a", "2", "b"),
			perKey:    true,
			want:      OrderReport{Committed: 2, Delivered: 2, KeyMismatches: 1, Groups: 1},
		},
		{
			name:      "per key: lost and duplicated",
			committed: rows(ids("1", "2", "3"), "a", "b", "a"),
			entries:   keyed("1", "a", "3", "a", "1", "a"),
			perKey:    true,
			want: OrderReport{Committed: 3, Delivered: 3, Lost: 1, Duplicates: 1, Groups: 1,
				LostIDs: []string{"2"}, DuplicateIDs: []string{"1"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, CheckOrder(tc.committed, tc.entries, tc.perKey))
		})
	}
}

func TestCheckOrderNamesAtMostTen(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	committed := make([]Committed, 0, 30)
	var entries []Entry
	for i := range 30 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		committed = append(committed, Committed{ID: id, CreatedAt: t0.Add(time.Duration(i) * time.Second)})
	}
	for i := 29; i >= 10; i-- { // 20 delivered in reverse: 19 reorderings; 10 lost
		entries = append(entries, Entry{EventID: committed[i].ID})
	}
	r := CheckOrder(committed, entries, false)
	require.Equal(t, 19, r.Reorderings)
	require.Equal(t, 10, r.Lost)
	require.Len(t, r.Reordered, maxNamed)
	require.Len(t, r.LostIDs, maxNamed)
}

func TestOrderReportString(t *testing.T) {
	t.Parallel()
	r := OrderReport{Committed: 3, Delivered: 4, Duplicates: 1, Groups: 2}
	require.Equal(t, "committed=3 delivered=4 lost=0 duplicates=1 reorderings=0 unexpected=0 key_mismatches=0 groups=2", r.String())
	require.Equal(t, Report{Committed: 3, Delivered: 4, Duplicates: 1}, r.Report())
}
