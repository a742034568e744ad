package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/scaling"
)

var statusNow = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

// stateOption changes a fixture relayState.
type stateOption func(*relayState)

// newState is a healthy reconcile: secrets resolved, backlog measured (10
// rows, the oldest a minute old), 2 replicas decided, written and available.
func newState(opts ...stateOption) *relayState {
	relay := newRelay("ns", "orders")
	relay.Generation = 4
	oldest := statusNow.Add(-time.Minute)
	st := &relayState{
		relay:   relay,
		now:     statusNow,
		table:   outbox.MustNew("", outbox.Columns{}),
		secrets: &resolvedSecrets{dsn: "postgres://x", redisURL: "redis://x", hash: "h"},
		backlog: &backlog.Observation{Last: &backlog.Result{
			Backlog:   outbox.Backlog{Count: 10, Oldest: &oldest},
			CheckedAt: statusNow.Add(-time.Second),
		}},
		decision:          scaling.Decision{Replicas: 2},
		deploymentWritten: true,
		resources:         &relayResources{deployment: availableDeployment(2)},
	}
	for _, o := range opts {
		o(st)
	}
	return st
}

func availableDeployment(n int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-relay", Generation: 3},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 3, Replicas: n, ReadyReplicas: n, UpdatedReplicas: n, AvailableReplicas: n,
		},
	}
}

func failed(cause backlog.Cause, msg string) stateOption {
	return func(st *relayState) {
		st.backlog = &backlog.Observation{Last: &backlog.Result{Failure: &backlog.Failure{Cause: cause, Message: msg}, CheckedAt: statusNow}}
	}
}

func TestComputeStatusReadyChain(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		opts   []stateOption
		status metav1.ConditionStatus
		reason v1alpha1.Reason
		// conds are other conditions expected, type -> reason
		conds map[v1alpha1.ConditionType]v1alpha1.Reason
	}{
		{"Healthy", nil, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady, map[v1alpha1.ConditionType]v1alpha1.Reason{
			v1alpha1.ConditionSecretsResolved:   v1alpha1.ReasonSecretsResolved,
			v1alpha1.ConditionDatabaseReachable: v1alpha1.ReasonBacklogMeasured,
			v1alpha1.ConditionBacklogHealthy:    v1alpha1.ReasonBacklogWithinLimit,
			v1alpha1.ConditionRelaysAvailable:   v1alpha1.ReasonRelaysAvailable,
			v1alpha1.ConditionDeadLettersClear:  v1alpha1.ReasonNoDeadLetters,
		}},
		{"SecretNotFound", []stateOption{func(st *relayState) {
			st.secrets, st.backlog, st.deploymentWritten = nil, nil, false
			st.secretsFailure = &failure{v1alpha1.ReasonSecretNotFound, "Secret x not found"}
		}}, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, map[v1alpha1.ConditionType]v1alpha1.Reason{
			v1alpha1.ConditionSecretsResolved:   v1alpha1.ReasonSecretNotFound,
			v1alpha1.ConditionDatabaseReachable: v1alpha1.ReasonBacklogCheckPending,
		}},
		{"SecretKeyMissingWinsOverSuspend", []stateOption{withStateSuspend, func(st *relayState) {
			st.secrets, st.backlog = nil, nil
			st.secretsFailure = &failure{v1alpha1.ReasonSecretKeyMissing, "no key"}
		}}, metav1.ConditionFalse, v1alpha1.ReasonSecretKeyMissing, nil},
		{"InvalidSpec", []stateOption{func(st *relayState) {
			st.specFailure = &failure{v1alpha1.ReasonInvalidSpec, "bad"}
			st.backlog = nil
		}}, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, nil},
		{"TableSharedWinsOverDeploymentFailed", []stateOption{func(st *relayState) {
			st.tableShared = tableSharedFailure(st.relay, []string{"audit"})
			st.childFailure = &failure{v1alpha1.ReasonDeploymentFailed, "forbidden"}
		}}, metav1.ConditionFalse, v1alpha1.ReasonTableShared, nil},
		{"DeploymentFailed", []stateOption{func(st *relayState) {
			st.childFailure = &failure{v1alpha1.ReasonDeploymentFailed, "forbidden"}
		}}, metav1.ConditionFalse, v1alpha1.ReasonDeploymentFailed, nil},
		{"DatabaseUnreachable", []stateOption{failed(backlog.CauseUnreachable, "connection refused")},
			metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable, map[v1alpha1.ConditionType]v1alpha1.Reason{
				v1alpha1.ConditionBacklogHealthy: v1alpha1.ReasonBacklogUnknown,
			}},
		{"OutboxTableNotFound", []stateOption{failed(backlog.CauseTableNotFound, "relation does not exist")},
			metav1.ConditionFalse, v1alpha1.ReasonOutboxTableNotFound, nil},
		{"OutboxColumnNotFound", []stateOption{failed(backlog.CauseColumnNotFound, "column does not exist")},
			metav1.ConditionFalse, v1alpha1.ReasonOutboxColumnNotFound, nil},
		{"DSNInvalid", []stateOption{failed(backlog.CauseInvalidDSN, "not a DSN")},
			metav1.ConditionFalse, v1alpha1.ReasonDSNInvalid, nil},
		{"FirstCheckRunning", []stateOption{func(st *relayState) { st.backlog = &backlog.Observation{InFlight: true} }},
			metav1.ConditionUnknown, v1alpha1.ReasonBacklogCheckPending, nil},
		{"Suspended", []stateOption{withStateSuspend}, metav1.ConditionFalse, v1alpha1.ReasonSuspended,
			map[v1alpha1.ConditionType]v1alpha1.Reason{v1alpha1.ConditionRelaysAvailable: v1alpha1.ReasonSuspended}},
		{"SuspendedWinsOverStalled", []stateOption{withStateSuspend, oldestAgo(time.Hour)}, metav1.ConditionFalse, v1alpha1.ReasonSuspended,
			map[v1alpha1.ConditionType]v1alpha1.Reason{v1alpha1.ConditionBacklogHealthy: v1alpha1.ReasonBacklogStalled}},
		{"BacklogStalled", []stateOption{oldestAgo(6 * time.Minute)}, metav1.ConditionFalse, v1alpha1.ReasonBacklogStalled, nil},
		{"BacklogAtTheLimitIsNotStalled", []stateOption{oldestAgo(5 * time.Minute)}, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady, nil},
		{"NoDeploymentYet", []stateOption{func(st *relayState) { st.resources.deployment = nil }},
			metav1.ConditionFalse, v1alpha1.ReasonRelaysProgressing, nil},
		{"RolloutNotObserved", []stateOption{func(st *relayState) { st.resources.deployment.Generation = 4 }},
			metav1.ConditionFalse, v1alpha1.ReasonRelaysProgressing, nil},
		{"ScalingUp", []stateOption{func(st *relayState) { st.decision.Replicas = 3 }},
			metav1.ConditionFalse, v1alpha1.ReasonRelaysProgressing, nil},
		{"DeadLettersLeaveReadyAlone", []stateOption{parked(3)}, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady,
			map[v1alpha1.ConditionType]v1alpha1.Reason{v1alpha1.ConditionDeadLettersClear: v1alpha1.ReasonDeadLettersPresent}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := computeStatus(newState(tc.opts...))
			ready := meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionReady))
			require.NotNil(t, ready)
			require.Equal(t, tc.status, ready.Status, ready.Message)
			require.Equal(t, string(tc.reason), ready.Reason, ready.Message)
			require.Equal(t, int64(4), ready.ObservedGeneration)
			require.NotEmpty(t, ready.Message)
			for typ, reason := range tc.conds {
				c := meta.FindStatusCondition(s.Conditions, string(typ))
				require.NotNil(t, c, typ)
				require.Equal(t, string(reason), c.Reason, "%s: %s", typ, c.Message)
			}
			require.Len(t, s.Conditions, 8) // StreamIntact (outboxrelay_stream.go) and RedisDurable (outboxrelay_redis.go) too
		})
	}
}

func withStateSuspend(st *relayState) {
	st.relay.Spec.Suspend = true
	st.decision.Replicas = 0
	st.resources.deployment = availableDeployment(0)
}

// parked sets the count of parked rows the last check found.
func parked(n int64) stateOption {
	return func(st *relayState) { st.backlog.Last.Backlog.DeadLetters = n }
}

func oldestAgo(d time.Duration) stateOption {
	return func(st *relayState) {
		oldest := statusNow.Add(-d)
		st.backlog.Last.Backlog.Oldest = &oldest
	}
}

func TestComputeStatusFields(t *testing.T) {
	t.Parallel()
	st := newState(parked(3), func(st *relayState) {
		since := statusNow.Add(-time.Minute)
		st.decision = scaling.Decision{Replicas: 2, ScaleDownPendingSince: &since}
		st.resources.deployment.Status.ReadyReplicas = 1
		st.resources.cronJob = nil
	})
	s := computeStatus(st)
	require.Equal(t, int64(4), s.ObservedGeneration)
	require.Equal(t, ptr.To[int64](10), s.Backlog)
	require.Equal(t, ptr.To[int64](3), s.DeadLetters, "parked rows are counted apart from the backlog")
	require.Equal(t, statusNow.Add(-time.Minute), s.OldestPendingTime.Time)
	require.Equal(t, statusNow.Add(-time.Second), s.LastBacklogCheckTime.Time)
	require.Equal(t, ptr.To[int32](2), s.DesiredReplicas)
	require.Equal(t, int32(2), s.Replicas)
	require.Equal(t, int32(1), s.ReadyReplicas)
	require.Equal(t, "1/2", s.ReplicaSummary)
	require.Equal(t, statusNow.Add(-time.Minute), s.ScaleDownPendingSince.Time)
}

func TestComputeStatusKeepsLastMeasurementOnFailure(t *testing.T) {
	t.Parallel()
	st := newState(failed(backlog.CauseUnreachable, "refused"), func(st *relayState) {
		st.relay.Status.Backlog = ptr.To[int64](99)
		st.relay.Status.DeadLetters = ptr.To[int64](7)
		st.relay.Status.LastBacklogCheckTime = metaTime(statusNow.Add(-time.Hour))
		st.relay.Status.DesiredReplicas = ptr.To[int32](5)
		st.deploymentWritten = false
	})
	s := computeStatus(st)
	require.Equal(t, ptr.To[int64](99), s.Backlog, "a failed check keeps the last measurement")
	require.Equal(t, ptr.To[int64](7), s.DeadLetters, "a failed check keeps the last count of parked rows")
	require.Equal(t, statusNow.Add(-time.Hour), s.LastBacklogCheckTime.Time)
	require.Equal(t, ptr.To[int32](5), s.DesiredReplicas, "children not written: the desired count stays")
}

func TestComputeStatusIsStable(t *testing.T) {
	t.Parallel()
	// A status computed, stored and recomputed a second later without any
	// change is equal, so no write happens.
	st := newState(oldestAgo(time.Hour))
	first := computeStatus(st)
	st2 := newState(oldestAgo(time.Hour))
	st2.relay.Status = first
	st2.now = statusNow.Add(time.Second)
	oldest := statusNow.Add(-time.Hour)
	st2.backlog.Last.Backlog.Oldest = &oldest
	require.Equal(t, first, computeStatus(st2))
}

func TestDatabaseConditionKeepsOldWhileFirstCheckRuns(t *testing.T) {
	t.Parallel()
	st := newState(func(st *relayState) {
		st.backlog = &backlog.Observation{InFlight: true}
		st.relay.Status.Conditions = []metav1.Condition{{
			Type: string(v1alpha1.ConditionDatabaseReachable), Status: metav1.ConditionTrue,
			Reason: string(v1alpha1.ReasonBacklogMeasured), Message: "measured",
		}}
	})
	c := databaseCondition(st)
	require.Equal(t, metav1.ConditionTrue, c.status)
	require.Equal(t, v1alpha1.ReasonBacklogMeasured, c.reason)
}

func TestRequeueAfter(t *testing.T) {
	t.Parallel()
	type want struct {
		after   time.Duration
		routine bool
	}
	cases := []struct {
		name         string
		state        func(st *relayState)
		checkTimeout time.Duration
		want         want
	}{
		{"NextCheck", func(st *relayState) { st.backlog.NextCheckIn = 30 * time.Second }, 10 * time.Second, want{30 * time.Second, true}},
		{"ScaleDownWindowFirst", func(st *relayState) {
			st.backlog.NextCheckIn = 30 * time.Second
			st.decision.RecheckAfter = 10 * time.Second
		}, 10 * time.Second, want{10 * time.Second, false}},
		// The oldest row (a minute old) turns stalled in 4 minutes: 4m1s.
		{"StalledFirst", func(st *relayState) { st.backlog.NextCheckIn = time.Hour }, 10 * time.Second, want{4*time.Minute + time.Second, false}},
		// While a check is queued or runs, the Prober's notification comes
		// first: the safety net is the check interval (30s by default), or
		// longer than a check can run.
		{"InFlight", func(st *relayState) { st.backlog = &backlog.Observation{InFlight: true} }, 10 * time.Second, want{30 * time.Second, true}},
		{"InFlightLongChecks", func(st *relayState) { st.backlog = &backlog.Observation{InFlight: true} }, 40 * time.Second, want{41 * time.Second, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			after, routine := newState(tc.state).requeueAfter(tc.checkTimeout)
			require.Equal(t, tc.want, want{after, routine})
		})
	}
}

func TestDeadLettersCondition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		opts     []stateOption
		status   metav1.ConditionStatus
		reason   v1alpha1.Reason
		messages []string
	}{
		{"None", nil, metav1.ConditionTrue, v1alpha1.ReasonNoDeadLetters,
			[]string{"no row is parked in table outbox_events_dead_letters"}},
		{"Some", []stateOption{parked(3)}, metav1.ConditionFalse, v1alpha1.ReasonDeadLettersPresent, []string{
			"3 rows are parked in table outbox_events_dead_letters because they cannot be published",
			"not part of the backlog", "see them with `relay dead-letters list`",
		}},
		{"One", []stateOption{parked(1)}, metav1.ConditionFalse, v1alpha1.ReasonDeadLettersPresent,
			[]string{"1 row is parked in"}},
		{"OtherTableNeedsTheFlag", []stateOption{parked(2), func(st *relayState) {
			st.table = outbox.MustNew("app.events", outbox.Columns{})
		}}, metav1.ConditionFalse, v1alpha1.ReasonDeadLettersPresent, []string{
			"parked in table app.events_dead_letters", "`relay dead-letters list --table=app.events`",
		}},
		{"NotMeasuredYet", []stateOption{func(st *relayState) { st.backlog = &backlog.Observation{InFlight: true} }},
			metav1.ConditionUnknown, v1alpha1.ReasonBacklogUnknown, []string{"not been checked yet"}},
		{"CountFromBeforeARestart", []stateOption{func(st *relayState) {
			st.backlog = &backlog.Observation{InFlight: true}
			st.relay.Status.DeadLetters = ptr.To[int64](4)
		}}, metav1.ConditionFalse, v1alpha1.ReasonDeadLettersPresent, []string{"4 rows are parked"}},
		{"CheckFailed", []stateOption{failed(backlog.CauseUnreachable, "refused"), func(st *relayState) {
			st.relay.Status.DeadLetters = ptr.To[int64](4)
		}}, metav1.ConditionUnknown, v1alpha1.ReasonBacklogUnknown, []string{"the last backlog check failed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := computeStatus(newState(tc.opts...))
			c := meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionDeadLettersClear))
			require.NotNil(t, c)
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, string(tc.reason), c.Reason, c.Message)
			require.Equal(t, int64(4), c.ObservedGeneration)
			for _, m := range tc.messages {
				require.Contains(t, c.Message, m)
			}
		})
	}
}

func TestDeadLettersEvent(t *testing.T) {
	t.Parallel()
	n := ptr.To[int64]
	cases := []struct {
		name     string
		old, now *int64
		reason   v1alpha1.Reason // empty: no Event
	}{
		{"NeverMeasured", nil, nil, ""},
		{"FirstCheckFindsNone", nil, n(0), ""},
		{"FirstCheckFindsSome", nil, n(3), v1alpha1.ReasonDeadLettersPresent},
		{"Appeared", n(0), n(1), v1alpha1.ReasonDeadLettersPresent},
		{"Grew", n(1), n(5), ""},
		{"Shrank", n(5), n(2), ""},
		{"Cleared", n(2), n(0), v1alpha1.ReasonNoDeadLetters},
		{"StillNone", n(0), n(0), ""},
		{"CountDropped", n(2), nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reason, ok := deadLettersEvent(tc.old, tc.now)
			require.Equal(t, tc.reason != "", ok)
			require.Equal(t, tc.reason, reason)
		})
	}
	require.True(t, v1alpha1.ReasonDeadLettersPresent.IsFailure(), "a Warning")
	require.False(t, v1alpha1.ReasonNoDeadLetters.IsFailure(), "a Normal Event")
}
