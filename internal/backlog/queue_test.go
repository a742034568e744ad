package backlog

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

func TestDueQueue(t *testing.T) {
	t.Parallel()
	type push struct {
		name string
		lane lane
	}
	cases := []struct {
		name   string
		pushes []push
		remove []string
		// pops: whether the failing lane may go at each pop; want: the
		// names popped ("" for none).
		pops []bool
		want []string
	}{
		{"Empty", nil, nil, []bool{true, false}, []string{"", ""}},
		{"FirstComeFirstServedAcrossLanes",
			[]push{{"a", laneAnswering}, {"f", laneFailing}, {"b", laneAnswering}}, nil,
			[]bool{true, true, true, true}, []string{"a", "f", "b", ""}},
		{"FailingLaneHeldBack",
			[]push{{"f1", laneFailing}, {"a", laneAnswering}, {"f2", laneFailing}}, nil,
			[]bool{false, false, true, true}, []string{"a", "", "f1", "f2"}},
		{"OnlyFailingAndHeldBack", []push{{"f", laneFailing}}, nil, []bool{false, true}, []string{"", "f"}},
		{"Removed",
			[]push{{"a", laneAnswering}, {"b", laneAnswering}, {"f", laneFailing}}, []string{"a", "f"},
			[]bool{true, true}, []string{"b", ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var q dueQueue
			for _, p := range tc.pushes {
				q.push(key(p.name), p.lane)
			}
			for _, name := range tc.remove {
				q.remove(key(name))
			}
			require.Equal(t, len(tc.pushes)-len(tc.remove), q.len())
			got := make([]string, 0, len(tc.pops))
			for _, failingMayGo := range tc.pops {
				k, l, ok := q.pop(failingMayGo)
				switch {
				case !ok:
					require.Equal(t, types.NamespacedName{}, k)
					got = append(got, "")
				default:
					require.Equal(t, l == laneFailing, k.Name[0] == 'f', "%s came from its own lane", k.Name)
					got = append(got, k.Name)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}
