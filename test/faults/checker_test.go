package faults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rows := func(ids ...string) []Committed {
		out := make([]Committed, len(ids))
		for i, id := range ids {
			out[i] = Committed{ID: id, CreatedAt: t0.Add(time.Duration(i) * time.Millisecond)}
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		committed []Committed
		delivered []string
		want      Report
	}{
		{name: "empty", want: Report{}},
		{
			name:      "exact",
			committed: rows("1", "2", "3"),
			delivered: []string{"1", "2", "3"},
			want:      Report{Committed: 3, Delivered: 3},
		},
		{
			name:      "lost",
			committed: rows("1", "2", "3"),
			delivered: []string{"1", "3"},
			want:      Report{Committed: 3, Delivered: 2, Lost: 1, LostIDs: []string{"2"}},
		},
		{
			name:      "a batch republished after a crash",
			committed: rows("1", "2", "3", "4"),
			delivered: []string{"1", "2", "3", "2", "3", "4"},
			want:      Report{Committed: 4, Delivered: 6, Duplicates: 2, DuplicateIDs: []string{"2", "3"}},
		},
		{
			name:      "three copies count twice, named once",
			committed: rows("1"),
			delivered: []string{"1", "1", "1"},
			want:      Report{Committed: 1, Delivered: 3, Duplicates: 2, DuplicateIDs: []string{"1"}},
		},
		{
			name:      "reordered",
			committed: rows("1", "2", "3", "4"),
			delivered: []string{"1", "3", "2", "4"},
			want:      Report{Committed: 4, Delivered: 4, Reordered: 1},
		},
		{
			name:      "unexpected",
			committed: rows("1"),
			delivered: []string{"1", "x"},
			want:      Report{Committed: 1, Delivered: 2, Unexpected: 1},
		},
		{
			name: "ties by numeric id",
			committed: []Committed{
				{ID: "9", CreatedAt: t0}, {ID: "10", CreatedAt: t0},
			},
			delivered: []string{"9", "10"},
			want:      Report{Committed: 2, Delivered: 2},
		},
		{
			name: "ties by id, numeric id out of order",
			committed: []Committed{
				{ID: "9", CreatedAt: t0}, {ID: "10", CreatedAt: t0},
			},
			delivered: []string{"10", "9"},
			want:      Report{Committed: 2, Delivered: 2, Reordered: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, Check(tc.committed, tc.delivered))
		})
	}
}

func TestReportString(t *testing.T) {
	t.Parallel()
	r := Report{Committed: 3, Delivered: 4, Duplicates: 1}
	require.Equal(t, "committed=3 delivered=4 lost=0 duplicates=1 reordered=0 unexpected=0", r.String())
}
