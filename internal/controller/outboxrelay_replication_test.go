package controller

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// withSource sets spec.source.
func withSource(source v1alpha1.Source) relayOption {
	return func(r *v1alpha1.OutboxRelay) { r.Spec.Source = source }
}

// slotPattern is what the relay accepts as --slot (logical.SlotPattern).
var slotPattern = regexp.MustCompile(logical.SlotPattern)

// TestReplicationSlotName: readable, valid for the relay and PostgreSQL,
// deterministic, and different for every pair of namespace and name, also
// where the readable part is the same or cut.
func TestReplicationSlotName(t *testing.T) {
	t.Parallel()
	name := replicationSlotName("shop", "orders")
	require.Regexp(t, `^outbox_shop_orders_[0-9a-f]{10}$`, name)
	require.Equal(t, name, ReplicationSlotName(newRelay("shop", "orders")), "deterministic")

	longNS, longName := strings.Repeat("n", 63), strings.Repeat("r", 44)
	seen := map[string][2]string{}
	for _, pair := range [][2]string{
		{"shop", "orders"}, {"shop", "orders.v2"}, {"shop-eu", "orders"}, {"Shop", "Orders"},
		{"a-b", "c"}, {"a", "b-c"}, {"a_b", "c"}, {"a.b", "c"}, // the same readable part
		{longNS, longName}, {longNS, longName[:43] + "s"}, {longNS + "x", longName}, // cut the same way
	} {
		got := replicationSlotName(pair[0], pair[1])
		require.Regexp(t, slotPattern, got, "%v", pair)
		require.LessOrEqual(t, len(got), 63, "%v", pair)
		require.True(t, strings.HasPrefix(got, "outbox_"), got)
		if other, dup := seen[got]; dup {
			t.Fatalf("%v and %v share slot %s", pair, other, got)
		}
		seen[got] = pair
	}
	require.Equal(t, "outbox_a_b_c", replicationSlotName("a-b", "c")[:len("outbox_a_b_c")])
}

// TestSourceArgs: the default source adds no flag (relays do not roll on
// an upgrade); LogicalReplication passes the source and the slot.
func TestSourceArgs(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		relayArgs(newRelay("shop", "orders")),
		relayArgs(newRelay("shop", "orders", withSource(v1alpha1.SourcePolling))),
	} {
		require.False(t, slices.ContainsFunc(args, func(a string) bool {
			return strings.HasPrefix(a, "--source") || strings.HasPrefix(a, "--slot")
		}), "%v", args)
	}
	relay := newRelay("shop", "orders", withSource(v1alpha1.SourceLogicalReplication))
	args := relayArgs(relay)
	require.Contains(t, args, "--source=LogicalReplication")
	require.Contains(t, args, "--slot="+ReplicationSlotName(relay))
}

// slotState is a reconcile of a relay of source LogicalReplication whose
// last check read the slot as given (nil: no slot result).
func slotState(slot *backlog.SlotResult, opts ...relayOption) stateOption {
	return func(st *relayState) {
		for _, o := range append([]relayOption{withSource(v1alpha1.SourceLogicalReplication)}, opts...) {
			o(st.relay)
		}
		st.slot = ReplicationSlotName(st.relay)
		st.backlog.Last.Slot = slot
	}
}

func slotResult(exists bool, walStatus string, retained, keep int64) *backlog.SlotResult {
	return &backlog.SlotResult{
		Status:         logical.SlotStatus{Exists: exists, WALStatus: walStatus, RetainedBytes: retained, LagBytes: retained / 2},
		MaxWALKeepSize: keep,
	}
}

func TestReplicationSlotCondition(t *testing.T) {
	t.Parallel()
	const gi = int64(1) << 30
	cases := []struct {
		name     string
		opts     []stateOption
		status   metav1.ConditionStatus
		reason   v1alpha1.Reason
		ready    v1alpha1.Reason
		contains []string
	}{
		{"Healthy", []stateOption{slotState(slotResult(true, "reserved", 1<<20, 10*gi))},
			metav1.ConditionTrue, v1alpha1.ReasonSlotHealthy, v1alpha1.ReasonRelaysReady, []string{"10.0 GiB"}},
		{"NotCheckedYet", []stateOption{slotState(nil)},
			metav1.ConditionUnknown, v1alpha1.ReasonBacklogUnknown, v1alpha1.ReasonRelaysReady, nil},
		{"CheckFailed", []stateOption{slotState(nil), failed(backlog.CauseUnreachable, "down")},
			metav1.ConditionUnknown, v1alpha1.ReasonBacklogUnknown, v1alpha1.ReasonDatabaseUnreachable, nil},
		{"Missing", []stateOption{slotState(slotResult(false, "", 0, -1))},
			metav1.ConditionUnknown, v1alpha1.ReasonSlotMissing, v1alpha1.ReasonRelaysReady, []string{"the relays create it"}},
		{"Invalidated", []stateOption{slotState(slotResult(true, "lost", 0, gi))},
			metav1.ConditionFalse, v1alpha1.ReasonSlotInvalidated, v1alpha1.ReasonRelaysReady,
			[]string{"wal_status lost", "recreate it and catch up from table outbox_events", "no event is lost"}},
		{"RetainingWAL", []stateOption{slotState(slotResult(true, "extended", 3*gi, 10*gi))},
			metav1.ConditionFalse, v1alpha1.ReasonSlotRetainingWAL, v1alpha1.ReasonSlotRetainingWAL,
			[]string{"keeps 3.0 GiB", "logicalReplication.maxRetainedWAL (1.0 GiB)", "max_slot_wal_keep_size (10.0 GiB)"}},
		{"RetainingWALUnderItsOwnLimit", []stateOption{slotState(slotResult(true, "extended", 3*gi, 10*gi), func(r *v1alpha1.OutboxRelay) {
			r.Spec.LogicalReplication.MaxRetainedWAL = ptr.To(resource.MustParse("4Gi"))
		})}, metav1.ConditionTrue, v1alpha1.ReasonSlotHealthy, v1alpha1.ReasonRelaysReady, nil},
		{"RetainingWALUnbounded", []stateOption{slotState(slotResult(true, "extended", 3*gi, -1))},
			metav1.ConditionFalse, v1alpha1.ReasonSlotRetainingWAL, v1alpha1.ReasonSlotRetainingWAL,
			[]string{"max_slot_wal_keep_size is unset"}},
		{"Unbounded", []stateOption{slotState(slotResult(true, "reserved", 1<<20, -1))},
			metav1.ConditionFalse, v1alpha1.ReasonSlotWALUnbounded, v1alpha1.ReasonRelaysReady,
			[]string{"max_slot_wal_keep_size is unset", "ALTER SYSTEM SET max_slot_wal_keep_size"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := computeStatus(newState(tc.opts...))
			c := meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy))
			require.NotNil(t, c)
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, string(tc.reason), c.Reason, c.Message)
			for _, want := range tc.contains {
				require.Contains(t, c.Message, want)
			}
			ready := meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionReady))
			require.Equal(t, string(tc.ready), ready.Reason, ready.Message)
			require.NotNil(t, s.Replication)
			require.Equal(t, ReplicationSlotName(newRelay("ns", "orders")), s.Replication.SlotName)
		})
	}

	t.Run("PollingHasNone", func(t *testing.T) {
		t.Parallel()
		st := newState()
		st.relay.Status.Conditions = []metav1.Condition{{Type: string(v1alpha1.ConditionReplicationSlotHealthy), Status: metav1.ConditionTrue}}
		s := computeStatus(st)
		require.Nil(t, meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy)))
		require.Nil(t, s.Replication)
	})
	t.Run("StatusReportsTheSlot", func(t *testing.T) {
		t.Parallel()
		res := slotResult(true, "reserved", 4096, 1<<30)
		res.Status.Active = true
		res.Status.SafeWALSize = ptr.To[int64](1 << 29)
		s := computeStatus(newState(slotState(res)))
		require.Equal(t, &v1alpha1.ReplicationStatus{
			SlotName: ReplicationSlotName(newRelay("ns", "orders")), SlotExists: true, Active: true, WALStatus: "reserved",
			RetainedBytes: ptr.To[int64](4096), LagBytes: ptr.To[int64](2048), SafeWALSizeBytes: ptr.To[int64](1 << 29),
			MaxSlotWALKeepSizeBytes: ptr.To[int64](1 << 30),
		}, s.Replication)
	})
}

// TestLogicalReplicationRunsMaxOfMinAndOne: one relay reads the slot, so the
// backlog adds no relays beyond replicas.min, and one runs even with
// replicas.min 0 and no backlog (a slot's backlog misses some rows).
func TestLogicalReplicationRunsMaxOfMinAndOne(t *testing.T) {
	t.Parallel()
	r := &OutboxRelayReconciler{}
	for _, tc := range []struct {
		min, max int32
		backlog  int64
		want     int32
	}{{1, 5, 50_000, 1}, {2, 5, 50_000, 2}, {0, 5, 50_000, 1}, {0, 5, 0, 1}, {2, 5, 0, 2}} {
		st := newState(slotState(nil), func(st *relayState) {
			st.relay.Spec.Replicas = v1alpha1.ReplicasSpec{Min: ptr.To(tc.min), Max: tc.max}
			st.relay.Status.DesiredReplicas = nil
			st.backlog.Last.Backlog.Count = tc.backlog
		})
		r.decideReplicas(st)
		require.Equal(t, tc.want, st.decision.Replicas, "min %d max %d backlog %d", tc.min, tc.max, tc.backlog)
	}
}

// TestLogicalReplicationExternalRunsAtLeastOne: in replicas.mode External an
// autoscaler that scales on the backlog (KEDA with minReplicaCount 0) writes
// count 0 when the slot's backlog reads zero; that backlog misses rows (a
// transaction begun before the last published commit), so the operator
// still runs one relay, as in Operator mode; suspend still means zero.
func TestLogicalReplicationExternalRunsAtLeastOne(t *testing.T) {
	t.Parallel()
	r := &OutboxRelayReconciler{}
	for _, tc := range []struct {
		count   int32
		suspend bool
		want    int32
	}{{0, false, 1}, {1, false, 1}, {3, false, 3}, {0, true, 0}, {2, true, 0}} {
		st := newState(slotState(nil, withExternalReplicas(tc.count)), func(st *relayState) {
			st.relay.Spec.Suspend = tc.suspend
			st.backlog.Last.Backlog.Count = 0
		})
		r.decideReplicas(st)
		require.Equal(t, tc.want, st.decision.Replicas, "count %d suspend %v", tc.count, tc.suspend)
	}
	// Polling keeps the autoscaler's zero: its backlog sees every pending row.
	st := newState(func(st *relayState) { withExternalReplicas(0)(st.relay) })
	r.decideReplicas(st)
	require.Equal(t, int32(0), st.decision.Replicas)
}

func TestReplicationSlotEvent(t *testing.T) {
	t.Parallel()
	c := func(reason v1alpha1.Reason) *metav1.Condition { return &metav1.Condition{Reason: string(reason)} }
	for _, tc := range []struct {
		old, now *metav1.Condition
		want     v1alpha1.Reason
		ok       bool
	}{
		{nil, c(v1alpha1.ReasonSlotHealthy), "", false},
		{nil, c(v1alpha1.ReasonSlotMissing), "", false},
		{c(v1alpha1.ReasonSlotMissing), c(v1alpha1.ReasonSlotWALUnbounded), v1alpha1.ReasonSlotWALUnbounded, true},
		{c(v1alpha1.ReasonSlotHealthy), c(v1alpha1.ReasonSlotRetainingWAL), v1alpha1.ReasonSlotRetainingWAL, true},
		{c(v1alpha1.ReasonSlotRetainingWAL), c(v1alpha1.ReasonSlotRetainingWAL), "", false},
		{c(v1alpha1.ReasonSlotHealthy), c(v1alpha1.ReasonBacklogUnknown), "", false},
	} {
		got, ok := replicationSlotEvent(tc.old, tc.now)
		require.Equal(t, tc.ok, ok)
		require.Equal(t, tc.want, got)
	}
}

// dropSlotInCleanup drops the slot when the test ends, before its database
// is dropped (a slot blocks DROP DATABASE), whether or not the operator
// dropped it.
func dropSlotInCleanup(t *testing.T, conn *pgx.Conn, slot string) {
	t.Helper()
	t.Cleanup(func() {
		if err := logical.DropSlot(context.Background(), conn, slot); err != nil {
			t.Errorf("dropping slot %s: %v", slot, err)
		}
	})
}

// slotExists reports whether the database's server has the slot.
func slotExists(t *testing.T, conn *pgx.Conn, slot string) bool {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n))
	return n > 0
}

func (s *suite) waitFinalizer(t *testing.T, key types.NamespacedName) {
	t.Helper()
	eventually(t, "the finalizer "+v1alpha1.FinalizerReplicationSlot, func() error {
		if f := s.relay(t, key).Finalizers; !slices.Contains(f, v1alpha1.FinalizerReplicationSlot) {
			return fmt.Errorf("finalizers %v", f)
		}
		return nil
	})
}

func (s *suite) waitGone(t *testing.T, key types.NamespacedName) {
	t.Helper()
	eventually(t, key.String()+" deleted", func() error {
		err := s.c.Get(context.Background(), key, &v1alpha1.OutboxRelay{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (get: %v)", err)
	})
}

// testLogicalReplicationRelay follows a relay of source LogicalReplication
// from its creation to its deletion, playing the relay by hand (no relay
// runs in envtest): the finalizer, the relay flags, the CronJob's --slot, the backlog
// before and after the relay's progress, the slot missing, then unbounded
// (the shared test server leaves max_slot_wal_keep_size unset) without
// touching Ready, then retaining WAL past maxRetainedWAL (Ready False), and
// the deletion that deletes the relays' Deployment, waits for its
// ReplicaSets and pods, and drops the slot.
func testLogicalReplicationRelay(t *testing.T, s *suite) {
	key, conn := s.readyRelay(t, withSource(v1alpha1.SourceLogicalReplication), withReplicas(1, 5, 10, ""))
	ctx := context.Background()
	slot := ReplicationSlotName(s.relay(t, key))
	dropSlotInCleanup(t, conn, slot)

	s.waitFinalizer(t, key)
	args := s.deployment(t, key).Spec.Template.Spec.Containers[0].Args
	require.Contains(t, args, "--source=LogicalReplication")
	require.Contains(t, args, "--slot="+slot)

	// Rows written before any relay ran: no progress table yet, every row
	// is backlog; the backlog asks for no more than replicas.min.
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 25)`)
	require.NoError(t, err)
	relay := s.waitStatus(t, key, "backlog 25", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, -1) != 25 {
			return fmt.Errorf("backlog %v", ptr.Deref(st.Backlog, -1))
		}
		return nil
	})
	require.Equal(t, ptr.To[int32](1), relay.Status.DesiredReplicas, "one reader per slot: no scaling by the backlog")
	relay = s.waitCondition(t, key, v1alpha1.ConditionReplicationSlotHealthy, metav1.ConditionUnknown, v1alpha1.ReasonSlotMissing)
	require.Equal(t, slot, relay.Status.Replication.SlotName)
	require.False(t, relay.Status.Replication.SlotExists)
	cj := &batchv1.CronJob{}
	eventually(t, "the cleanup CronJob", func() error {
		return s.c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: "orders-cleanup"}, cj)
	})
	require.Contains(t, cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, "--slot="+slot,
		"rows are never marked: cleanup deletes them by age, behind the slot's progress")

	// The relay starts: its slot exists, on a server without
	// max_slot_wal_keep_size. A warning; Ready does not change for it.
	_, err = conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	relay = s.waitCondition(t, key, v1alpha1.ConditionReplicationSlotHealthy, metav1.ConditionFalse, v1alpha1.ReasonSlotWALUnbounded)
	require.Contains(t, findCondition(relay, v1alpha1.ConditionReplicationSlotHealthy).Message, "max_slot_wal_keep_size is unset")
	require.True(t, relay.Status.Replication.SlotExists)
	require.Equal(t, ptr.To[int64](-1), relay.Status.Replication.MaxSlotWALKeepSizeBytes)
	require.NotNil(t, relay.Status.Replication.RetainedBytes)
	s.waitEvent(t, key, v1alpha1.ReasonSlotWALUnbounded)
	s.markAvailable(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
	require.GreaterOrEqual(t, gauge(t, s, "outbox_operator_relay_replication_slot_retained_bytes", key), 0.0)

	// The relay published everything so far (its progress row): the
	// backlog is the rows created since, not the rows never marked.
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureProgressTable(ctx, conn))
	now, err := outbox.Now(ctx, conn)
	require.NoError(t, err)
	require.NoError(t, table.RecordProgress(ctx, conn, slot, now, true, nil))
	_, err = conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	s.waitStatus(t, key, "backlog 3 (BacklogSince)", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, -1) != 3 {
			return fmt.Errorf("backlog %v", ptr.Deref(st.Backlog, -1))
		}
		return nil
	})

	// The slot keeps more WAL than maxRetainedWAL: Ready says so.
	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) {
		r.Spec.LogicalReplication.MaxRetainedWAL = ptr.To(resource.MustParse("1Ki"))
	})
	_, err = conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 't', repeat('x', 100) FROM generate_series(1, 200)`)
	require.NoError(t, err)
	relay = s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSlotRetainingWAL)
	c := findCondition(relay, v1alpha1.ConditionReplicationSlotHealthy)
	require.Equal(t, string(v1alpha1.ReasonSlotRetainingWAL), c.Reason)
	require.Contains(t, c.Message, "logicalReplication.maxRetainedWAL (1.0 KiB)")
	require.Greater(t, *relay.Status.Replication.RetainedBytes, int64(1024))
	require.Greater(t, gauge(t, s, "outbox_operator_relay_replication_slot_retained_bytes", key), 1024.0)
	s.waitEvent(t, key, v1alpha1.ReasonSlotRetainingWAL)

	// Deleted: the Deployment is deleted, and the slot is dropped only once
	// nothing is left that could start a relay and make the slot again: a
	// ReplicaSet and a relay pod (made here by hand: envtest runs neither
	// the deployment controller nor the garbage collector) hold the drop
	// back until each is gone.
	dep := s.deployment(t, key)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: "orders-relay-5d9f", Labels: dep.Spec.Template.Labels},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](1), Selector: dep.Spec.Selector, Template: *dep.Spec.Template.DeepCopy(),
		},
	}
	require.NoError(t, s.c.Create(ctx, rs))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: "orders-relay-5d9f-x2x7q", Labels: dep.Spec.Template.Labels},
		Spec:       *dep.Spec.Template.Spec.DeepCopy(),
	}
	require.NoError(t, s.c.Create(ctx, pod))
	require.NoError(t, s.c.Delete(ctx, s.relay(t, key)))
	left := func(n int) {
		t.Helper()
		s.waitStatus(t, key, fmt.Sprintf("SlotDropPending, %d left", n), func(st *v1alpha1.OutboxRelayStatus) error {
			c := meta.FindStatusCondition(st.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy))
			if c == nil || c.Reason != string(v1alpha1.ReasonSlotDropPending) || !strings.Contains(c.Message, fmt.Sprintf("(%d left)", n)) {
				return fmt.Errorf("condition %+v", c)
			}
			return nil
		})
	}
	left(2) // the Deployment deleted; its ReplicaSet and the pod left
	err = s.c.Get(ctx, client.ObjectKeyFromObject(dep), &appsv1.Deployment{})
	require.True(t, apierrors.IsNotFound(err), "the relay Deployment is deleted, not scaled: %v", err)
	require.NoError(t, s.c.Delete(ctx, rs))
	left(1)
	require.True(t, slotExists(t, conn, slot), "a relay pod is left: the slot is not dropped yet")
	require.Contains(t, s.relay(t, key).Finalizers, v1alpha1.FinalizerReplicationSlot)
	require.NoError(t, s.c.Delete(ctx, pod))
	s.waitGone(t, key)
	require.False(t, slotExists(t, conn, slot), "the operator dropped the slot")
	s.waitEvent(t, key, v1alpha1.ReasonSlotDropped)
}

// testUndroppableSlotKeepsFinalizer: a relay of source LogicalReplication
// whose database cannot be reached is deleted: the finalizer stays, the
// conditions say why and how to finish by hand (no DSN, no password), and
// once the database answers the retry finishes the deletion.
func testUndroppableSlotKeepsFinalizer(t *testing.T, s *suite) {
	const password = "Canary-Slot-9d1e-Pa55word"
	ns := s.namespace(t)
	s.createSecrets(t, ns, "orders", fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/app?sslmode=disable", password, closedPort(t)))
	relay := newRelay(ns, "orders", withFastChecks(), withSource(v1alpha1.SourceLogicalReplication))
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)
	slot := ReplicationSlotName(relay)
	s.waitFinalizer(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)

	require.NoError(t, s.c.Delete(context.Background(), s.relay(t, key)))
	got := s.waitCondition(t, key, v1alpha1.ConditionReplicationSlotHealthy, metav1.ConditionFalse, v1alpha1.ReasonSlotDropFailed)
	require.NotNil(t, got.DeletionTimestamp)
	require.Contains(t, got.Finalizers, v1alpha1.FinalizerReplicationSlot, "kept until the slot is dropped")
	msg := findCondition(got, v1alpha1.ConditionReplicationSlotHealthy).Message
	require.Contains(t, msg, "PostgreSQL is unreachable from the operator")
	require.Contains(t, msg, "SELECT pg_drop_replication_slot('"+slot+"')")
	require.Contains(t, msg, `kubectl patch outboxrelay orders -n `+ns+` --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]'`)
	require.Equal(t, string(v1alpha1.ReasonSlotDropFailed), findCondition(got, v1alpha1.ConditionReady).Reason)
	ev := s.waitEvent(t, key, v1alpha1.ReasonSlotDropFailed)
	for _, text := range []string{msg, ev.Note, s.logs.String()} {
		require.NotContains(t, text, password)
		require.NotContains(t, text, "postgres://app")
	}
	require.NotContains(t, msg, "127.0.0.1")

	// The database answers (the slot was never created: nothing to drop).
	dsn, _ := database(t)
	s.createSecret(t, ns, "orders-db", "dsn", dsn)
	s.waitGone(t, key)
}
