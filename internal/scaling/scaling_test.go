package scaling

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
)

func TestRecommend(t *testing.T) {
	t.Parallel()
	p := Policy{Min: 1, Max: 5, TargetPerReplica: 1000}
	cases := []struct {
		name    string
		policy  Policy
		backlog int64
		want    int32
	}{
		{"EmptyIsMin", p, 0, 1},
		{"OneRowIsOneReplica", p, 1, 1},
		{"ExactMultiple", p, 2000, 2},
		{"RoundsUp", p, 2001, 3},
		{"CappedAtMax", p, 1_000_000, 5},
		{"NegativeCountsAsZero", p, -5, 1},
		{"MinZeroAllowsZero", Policy{Min: 0, Max: 3, TargetPerReplica: 10}, 0, 0},
		{"HugeBacklogDoesNotOverflow", Policy{Min: 0, Max: math.MaxInt32, TargetPerReplica: 1}, math.MaxInt64, math.MaxInt32},
		{"TargetBelowOneCountsAsOne", Policy{Min: 0, Max: 10, TargetPerReplica: 0}, 7, 7},
		{"MaxBelowMinCountsAsMin", Policy{Min: 3, Max: 1, TargetPerReplica: 10}, 1000, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.policy.Recommend(tc.backlog))
		})
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { return ptr.To(now.Add(-d)) }
	p := Policy{Min: 1, Max: 10, TargetPerReplica: 100, ScaleDownWindow: 5 * time.Minute}

	cases := []struct {
		name      string
		policy    Policy
		suspended bool
		backlog   *int64
		prev      State
		want      Decision
	}{
		{"FirstDecisionFollowsBacklog", p, false, ptr.To[int64](450), State{}, Decision{Replicas: 5}},
		{"FirstDecisionWithoutBacklogIsMin", p, false, nil, State{}, Decision{Replicas: 1}},
		{"SuspendedIsZero", p, true, ptr.To[int64](10_000), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(time.Minute)}, Decision{Replicas: 0}},
		{"ScaleUpIsImmediate", p, false, ptr.To[int64](900), State{Replicas: ptr.To[int32](2)}, Decision{Replicas: 9}},
		{"ScaleUpCancelsPendingScaleDown", p, false, ptr.To[int64](900), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(4 * time.Minute)}, Decision{Replicas: 9}},
		{"SameCountCancelsPendingScaleDown", p, false, ptr.To[int64](400), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(4 * time.Minute)}, Decision{Replicas: 4}},
		{"ScaleDownStartsWindow", p, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](4)},
			Decision{Replicas: 4, ScaleDownPendingSince: ptr.To(now), RecheckAfter: 5 * time.Minute}},
		{"ScaleDownWaitsInsideWindow", p, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(3 * time.Minute)},
			Decision{Replicas: 4, ScaleDownPendingSince: ago(3 * time.Minute), RecheckAfter: 2 * time.Minute}},
		{"ScaleDownAfterWindow", p, false, ptr.To[int64](150), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(5 * time.Minute)}, Decision{Replicas: 2}},
		{"ZeroWindowScalesDownAtOnce", Policy{Min: 1, Max: 10, TargetPerReplica: 100}, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](4)}, Decision{Replicas: 1}},
		{"PendingSinceInTheFutureRestartsWindow", p, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ptr.To(now.Add(time.Hour))},
			Decision{Replicas: 4, ScaleDownPendingSince: ptr.To(now), RecheckAfter: 5 * time.Minute}},
		{"UnknownBacklogKeepsCount", p, false, nil, State{Replicas: ptr.To[int32](4), ScaleDownPendingSince: ago(time.Hour)}, Decision{Replicas: 4}},
		{"UnknownBacklogClampsToNewMax", Policy{Min: 1, Max: 2, TargetPerReplica: 100}, false, nil, State{Replicas: ptr.To[int32](4)}, Decision{Replicas: 2}},
		{"UnknownBacklogWithMinZeroRunsOne", Policy{Min: 0, Max: 3, TargetPerReplica: 100}, false, nil, State{Replicas: ptr.To[int32](0)}, Decision{Replicas: 1}},
		{"FirstUnknownBacklogWithMinZeroRunsOne", Policy{Min: 0, Max: 3, TargetPerReplica: 100}, false, nil, State{}, Decision{Replicas: 1}},
		{"UnknownBacklogWhileSuspendedIsZero", Policy{Min: 0, Max: 3, TargetPerReplica: 100}, true, nil, State{}, Decision{Replicas: 0}},
		{"LoweredMaxAppliesAtOnce", Policy{Min: 1, Max: 2, TargetPerReplica: 100, ScaleDownWindow: time.Hour}, false, ptr.To[int64](1000), State{Replicas: ptr.To[int32](8)}, Decision{Replicas: 2}},
		{"ResumeFromZeroScalesUpAtOnce", p, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](0)}, Decision{Replicas: 1}},
		{"MinZeroScalesToZeroAfterWindow", Policy{Min: 0, Max: 3, TargetPerReplica: 100, ScaleDownWindow: time.Minute}, false, ptr.To[int64](0), State{Replicas: ptr.To[int32](1), ScaleDownPendingSince: ago(time.Minute)}, Decision{Replicas: 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, Decide(tc.policy, tc.suspended, tc.backlog, tc.prev, now))
		})
	}
}
