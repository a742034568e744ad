package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// condition is the outcome of one check: the status, reason and message of
// a condition.
type condition struct {
	status  metav1.ConditionStatus
	reason  v1alpha1.Reason
	message string
}

func trueCondition(reason v1alpha1.Reason, format string, args ...any) condition {
	return condition{metav1.ConditionTrue, reason, fmt.Sprintf(format, args...)}
}

func falseCondition(reason v1alpha1.Reason, message string) condition {
	return condition{metav1.ConditionFalse, reason, message}
}

func unknownCondition(reason v1alpha1.Reason, message string) condition {
	return condition{metav1.ConditionUnknown, reason, message}
}

// conditions are the evaluated conditions of one reconcile. deadLetters is
// not part of the Ready chain.
type conditions struct {
	secrets, database, backlog, relays, deadLetters, streamIntact, ready condition
	// slot is ReplicationSlotHealthy, with source LogicalReplication.
	slot condition
}

// computeStatus is the status the reconcile observed. It is pure: every
// input is in st, and the time is st.now.
func computeStatus(st *relayState) v1alpha1.OutboxRelayStatus {
	relay := st.relay
	s := *relay.Status.DeepCopy()
	s.ObservedGeneration = relay.Generation

	if last := st.lastSuccess(); last != nil {
		s.Backlog = ptr.To(last.Backlog.Count)
		s.BacklogCapped = last.Backlog.Capped
		s.OldestPendingTime = nil
		if last.Backlog.Oldest != nil {
			s.OldestPendingTime = metaTime(*last.Backlog.Oldest)
		}
		s.LastBacklogCheckTime = metaTime(last.CheckedAt)
		s.DeadLetters = ptr.To(last.Backlog.DeadLetters)
	}
	if st.deploymentWritten {
		s.DesiredReplicas = ptr.To(st.decision.Replicas)
		s.ScaleDownPendingSince = nil
		if st.decision.ScaleDownPendingSince != nil {
			s.ScaleDownPendingSince = metaTime(*st.decision.ScaleDownPendingSince)
		}
	}
	s.Replicas, s.ReadyReplicas = 0, 0
	if dep := st.resources.deployment; dep != nil {
		s.Replicas, s.ReadyReplicas = dep.Status.Replicas, dep.Status.ReadyReplicas
	}
	s.ReplicaSummary = fmt.Sprintf("%d/%d", s.ReadyReplicas, ptr.Deref(s.DesiredReplicas, 0))
	s.Selector = labels.SelectorFromSet(selectorLabels(relay, ComponentRelay)).String()
	if cj := st.resources.cronJob; cj != nil && cj.Status.LastSuccessfulTime != nil {
		s.LastCleanupTime = cj.Status.LastSuccessfulTime.DeepCopy()
	}
	s.Replication = replicationStatus(st, s.Replication) // outboxrelay_replication.go

	c := evaluateConditions(st, &s)
	for _, x := range []struct {
		t v1alpha1.ConditionType
		c condition
	}{
		{v1alpha1.ConditionSecretsResolved, c.secrets},
		{v1alpha1.ConditionDatabaseReachable, c.database},
		{v1alpha1.ConditionBacklogHealthy, c.backlog},
		{v1alpha1.ConditionRelaysAvailable, c.relays},
		{v1alpha1.ConditionDeadLettersClear, c.deadLetters},
		{v1alpha1.ConditionStreamIntact, c.streamIntact},
		{v1alpha1.ConditionReady, c.ready},
	} {
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{
			Type:               string(x.t),
			Status:             x.c.status,
			Reason:             string(x.c.reason),
			Message:            x.c.message,
			ObservedGeneration: relay.Generation,
			LastTransitionTime: *metaTime(st.now),
		})
	}
	setRedisDurable(st, &s) // outboxrelay_redis.go; not part of Ready
	setReplicationSlot(st, &s, c.slot)
	return s
}

// metaTime is t as the API stores it: UTC, whole seconds, so a status read
// back compares equal to the one computed.
func metaTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &mt
}

// evaluateConditions evaluates each condition, then Ready from them.
func evaluateConditions(st *relayState, s *v1alpha1.OutboxRelayStatus) conditions {
	c := conditions{
		secrets:      secretsCondition(st),
		database:     databaseCondition(st),
		backlog:      backlogCondition(st, s),
		relays:       relaysCondition(st, s),
		deadLetters:  deadLettersCondition(st, s),
		streamIntact: streamIntactCondition(st), // outboxrelay_stream.go
	}
	if st.slot != "" {
		c.slot = replicationSlotCondition(st, s) // outboxrelay_replication.go
	}
	c.ready = readyCondition(st, c)
	return c
}

func secretsCondition(st *relayState) condition {
	if f := st.secretsFailure; f != nil {
		return falseCondition(f.reason, f.message)
	}
	ref := st.relay.Spec
	return trueCondition(v1alpha1.ReasonSecretsResolved, "Secrets %q and %q hold the DSN and the Redis URL",
		ref.Postgres.DSNSecretRef.Name, ref.Redis.URLSecretRef.Name)
}

// databaseCondition reports the last backlog check. While the first check of
// this process is in flight, the condition already in the status stands, so
// a restart of the manager does not flap it.
func databaseCondition(st *relayState) condition {
	switch {
	case st.specFailure != nil:
		return unknownCondition(v1alpha1.ReasonBacklogCheckPending, "waiting for a valid spec.postgres")
	case st.secretsFailure != nil || st.backlog == nil:
		return unknownCondition(v1alpha1.ReasonBacklogCheckPending, "waiting for the Secrets")
	}
	last := st.backlog.Last
	if last == nil {
		if old := meta.FindStatusCondition(st.relay.Status.Conditions, string(v1alpha1.ConditionDatabaseReachable)); old != nil {
			return condition{old.Status, v1alpha1.Reason(old.Reason), old.Message}
		}
		return unknownCondition(v1alpha1.ReasonBacklogCheckPending, "the first backlog check is running")
	}
	if f := last.Failure; f != nil {
		return falseCondition(failureReason(f.Cause), fmt.Sprintf("backlog check of table %s failed: %s", st.table, f.Message))
	}
	return trueCondition(v1alpha1.ReasonBacklogMeasured, "the backlog of table %s was measured", st.table)
}

// failureReason maps the cause of a failed backlog check to a reason.
func failureReason(c backlog.Cause) v1alpha1.Reason {
	switch c {
	case backlog.CauseInvalidDSN:
		return v1alpha1.ReasonDSNInvalid
	case backlog.CauseTableNotFound:
		return v1alpha1.ReasonOutboxTableNotFound
	case backlog.CauseColumnNotFound:
		return v1alpha1.ReasonOutboxColumnNotFound
	case backlog.CauseDSNKeyNotAllowed:
		return v1alpha1.ReasonDSNKeyNotAllowed
	}
	return v1alpha1.ReasonDatabaseUnreachable
}

// backlogCondition judges the age of the oldest pending row in the status.
// The message holds the row's time, not its age, so it does not change on
// every reconcile.
func backlogCondition(st *relayState, s *v1alpha1.OutboxRelayStatus) condition {
	if st.backlog != nil && st.backlog.Last != nil && st.backlog.Last.Failure != nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the last backlog check failed")
	}
	if s.Backlog == nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the backlog has not been measured yet")
	}
	limit := st.relay.Spec.Backlog.GetStalledAfter()
	if oldest := s.OldestPendingTime; oldest != nil && st.now.Sub(oldest.Time) > limit {
		return falseCondition(v1alpha1.ReasonBacklogStalled, fmt.Sprintf(
			"the oldest undispatched row was created at %s, more than backlog.stalledAfter (%s) ago",
			oldest.UTC().Format(time.RFC3339), limit))
	}
	return trueCondition(v1alpha1.ReasonBacklogWithinLimit,
		"no undispatched row is older than backlog.stalledAfter (%s)", limit)
}

// deadLettersCondition reports the parked rows counted in the status. Like
// backlogCondition, it is Unknown when the last check failed; the count in
// the status stays then, so a recovery makes no new Event (deadLettersEvent).
func deadLettersCondition(st *relayState, s *v1alpha1.OutboxRelayStatus) condition {
	if st.backlog != nil && st.backlog.Last != nil && st.backlog.Last.Failure != nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the last backlog check failed")
	}
	if s.DeadLetters == nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the dead-letter table has not been checked yet")
	}
	table := "the dead-letter table"
	if st.table != nil {
		table = "table " + st.table.DeadLetterTable()
	}
	if n := *s.DeadLetters; n > 0 {
		return falseCondition(v1alpha1.ReasonDeadLettersPresent, deadLettersMessage(n, table, listDeadLettersCommand(st.table)))
	}
	return trueCondition(v1alpha1.ReasonNoDeadLetters, "no row is parked in %s", table)
}

// deadLettersMessage says how many rows are parked where, why that matters
// and what to run.
func deadLettersMessage(n int64, table, command string) string {
	rows := fmt.Sprintf("%d rows are", n)
	if n == 1 {
		rows = "1 row is"
	}
	return fmt.Sprintf("%s parked in %s because they cannot be published; they are not part of the backlog "+
		"and stay there until retried or discarded: see them with `%s`", rows, table, command)
}

// listDeadLettersCommand is the command that lists a table's parked rows:
// the relay needs --table unless the table is the default one.
func listDeadLettersCommand(table *outbox.Table) string {
	const cmd = "relay dead-letters list"
	if table == nil || table.String() == outbox.DefaultTable {
		return cmd
	}
	return cmd + " --table=" + table.String()
}

// relaysCondition compares the Deployment's rollout with desiredReplicas.
func relaysCondition(st *relayState, s *v1alpha1.OutboxRelayStatus) condition {
	if st.relay.Spec.Suspend {
		return falseCondition(v1alpha1.ReasonSuspended, "spec.suspend is true: the relays are scaled to zero")
	}
	dep := st.resources.deployment
	if dep == nil {
		return falseCondition(v1alpha1.ReasonRelaysProgressing,
			fmt.Sprintf("the Deployment %q does not exist yet", DeploymentName(st.relay)))
	}
	desired := ptr.Deref(s.DesiredReplicas, 0)
	if dep.Status.ObservedGeneration < dep.Generation {
		return falseCondition(v1alpha1.ReasonRelaysProgressing,
			fmt.Sprintf("the Deployment %q has not rolled out generation %d yet", dep.Name, dep.Generation))
	}
	if dep.Status.UpdatedReplicas < desired || dep.Status.AvailableReplicas < desired {
		return falseCondition(v1alpha1.ReasonRelaysProgressing, fmt.Sprintf(
			"%d of %d relays available and up to date", min(dep.Status.AvailableReplicas, dep.Status.UpdatedReplicas), desired))
	}
	return trueCondition(v1alpha1.ReasonRelaysAvailable, "%d of %d relays available", desired, desired)
}

// readyCheck is one step of the Ready chain: the first that fails names
// Ready's reason.
type readyCheck func(st *relayState, c conditions) (condition, bool)

// readyChain is the order in which problems are reported: what must be
// fixed first comes first.
var readyChain = []readyCheck{
	func(st *relayState, _ conditions) (condition, bool) {
		if st.reconcilePaused() {
			return falseCondition(v1alpha1.ReasonReconcilePaused, fmt.Sprintf(
				"the annotation %s=%s pauses the operator's writes to the Deployment and the CronJob; remove it to resume",
				v1alpha1.AnnotationReconcile, v1alpha1.ReconcileDisabled)), true
		}
		return condition{}, false
	},
	func(_ *relayState, c conditions) (condition, bool) {
		return c.secrets, c.secrets.status != metav1.ConditionTrue
	},
	func(st *relayState, _ conditions) (condition, bool) {
		if f := st.specFailure; f != nil {
			return falseCondition(f.reason, f.message), true
		}
		return condition{}, false
	},
	func(st *relayState, _ conditions) (condition, bool) {
		if f := st.tableShared; f != nil {
			return falseCondition(f.reason, f.message), true
		}
		return condition{}, false
	},
	func(st *relayState, _ conditions) (condition, bool) {
		if f := otherRelaysFailure(st); f != nil { // outboxrelay_shared.go
			return falseCondition(f.reason, f.message), true
		}
		return condition{}, false
	},
	func(st *relayState, _ conditions) (condition, bool) {
		if f := st.childFailure; f != nil {
			return falseCondition(f.reason, f.message), true
		}
		return condition{}, false
	},
	func(_ *relayState, c conditions) (condition, bool) {
		return c.database, c.database.status != metav1.ConditionTrue
	},
	func(_ *relayState, c conditions) (condition, bool) {
		return c.relays, c.relays.reason == v1alpha1.ReasonSuspended
	},
	func(_ *relayState, c conditions) (condition, bool) {
		return c.backlog, c.backlog.status != metav1.ConditionTrue
	},
	func(_ *relayState, c conditions) (condition, bool) {
		// Only this reason of ReplicationSlotHealthy: the server's disk
		// fills. The others are warnings, or resolve by themselves.
		return c.slot, c.slot.reason == v1alpha1.ReasonSlotRetainingWAL
	},
	func(_ *relayState, c conditions) (condition, bool) {
		return c.relays, c.relays.status != metav1.ConditionTrue
	},
}

func readyCondition(st *relayState, c conditions) condition {
	for _, check := range readyChain {
		if cond, failed := check(st, c); failed {
			if cond.status == metav1.ConditionTrue {
				cond.status = metav1.ConditionFalse
			}
			return cond
		}
	}
	return trueCondition(v1alpha1.ReasonRelaysReady, "the relays run as specified and the backlog is within limits")
}

// updateStatus writes the status computed from st, once, and only when it
// changed, with a merge patch from the status this process last wrote (the
// controller is the only writer of the status, so that is what the server
// holds, even when the cache has not caught up yet: no optimistic lock, no
// conflict to retry). Then it emits the Events of the transitions and
// refreshes the metrics.
func (r *OutboxRelayReconciler) updateStatus(ctx context.Context, st *relayState) error {
	relay := st.relay
	status := computeStatus(st)
	if r.Metrics != nil {
		r.Metrics.Set(client.ObjectKeyFromObject(relay), status)
		r.Metrics.SetStalledAfter(client.ObjectKeyFromObject(relay), relay.Spec.Backlog.GetStalledAfter())
	}
	if equality.Semantic.DeepEqual(relay.Status, status) {
		return nil
	}
	before := relay.DeepCopy()
	relay.Status = status
	if err := r.Status().Patch(ctx, relay, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	r.statuses.record(relay)
	r.recordTransitions(ctx, relay, &before.Status, &status)
	return nil
}

// writtenStatuses remembers the status this process last wrote for each
// OutboxRelay (by UID, so a relay deleted and created again under the same
// name starts afresh).
type writtenStatuses struct {
	mu       sync.Mutex
	statuses map[types.NamespacedName]writtenStatus
}

type writtenStatus struct {
	uid    types.UID
	status *v1alpha1.OutboxRelayStatus
}

func (w *writtenStatuses) record(relay *v1alpha1.OutboxRelay) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.statuses == nil {
		w.statuses = map[types.NamespacedName]writtenStatus{}
	}
	w.statuses[client.ObjectKeyFromObject(relay)] = writtenStatus{uid: relay.UID, status: relay.Status.DeepCopy()}
}

// restore replaces the relay's status with the one last written, if any.
func (w *writtenStatuses) restore(relay *v1alpha1.OutboxRelay) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ws, ok := w.statuses[client.ObjectKeyFromObject(relay)]; ok && ws.uid == relay.UID {
		relay.Status = *ws.status.DeepCopy()
	}
}

func (w *writtenStatuses) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.statuses, key)
}

// recordTransitions logs and emits an Event for each transition: a new
// Ready reason, parked rows appearing or gone, and a new replica count.
func (r *OutboxRelayReconciler) recordTransitions(ctx context.Context, relay *v1alpha1.OutboxRelay, old, now *v1alpha1.OutboxRelayStatus) {
	log := logf.FromContext(ctx)
	r.recordRedisTransition(ctx, relay, old, now)
	r.recordSlotTransition(ctx, relay, old, now)
	oldReady := meta.FindStatusCondition(old.Conditions, string(v1alpha1.ConditionReady))
	ready := meta.FindStatusCondition(now.Conditions, string(v1alpha1.ConditionReady))
	if ready != nil && (oldReady == nil || oldReady.Reason != ready.Reason || oldReady.Status != ready.Status) {
		log.Info("Changed Ready condition", "status", ready.Status, "reason", ready.Reason, "message", ready.Message)
		// Waiting (for the first backlog check, for a rollout) is not news;
		// the end of the wait is.
		if ready.Status != metav1.ConditionUnknown && ready.Reason != string(v1alpha1.ReasonRelaysProgressing) {
			eventType := corev1.EventTypeNormal
			if v1alpha1.Reason(ready.Reason).IsFailure() {
				eventType = corev1.EventTypeWarning
			}
			r.event(relay, eventType, ready.Reason, "Reconcile", ready.Message)
		}
	}
	if reason, ok := deadLettersEvent(old.DeadLetters, now.DeadLetters); ok {
		msg := "the dead-letter table is empty"
		if c := meta.FindStatusCondition(now.Conditions, string(v1alpha1.ConditionDeadLettersClear)); c != nil {
			msg = c.Message
		}
		eventType := corev1.EventTypeNormal
		if reason.IsFailure() {
			eventType = corev1.EventTypeWarning
		}
		log.Info("Changed dead-letter state", "reason", reason, "deadLetters", *now.DeadLetters)
		r.event(relay, eventType, string(reason), "MeasureBacklog", msg)
	}
	if old.DesiredReplicas != nil && now.DesiredReplicas != nil && *old.DesiredReplicas != *now.DesiredReplicas {
		msg := fmt.Sprintf("scaled the relays from %d to %d", *old.DesiredReplicas, *now.DesiredReplicas)
		if now.Backlog != nil {
			msg += fmt.Sprintf(" (backlog %d)", *now.Backlog)
		}
		log.Info("Scaled relays", "from", *old.DesiredReplicas, "to", *now.DesiredReplicas, "backlog", ptr.Deref(now.Backlog, -1))
		r.event(relay, corev1.EventTypeNormal, string(v1alpha1.ReasonScaled), "Scale", msg)
	}
}

// deadLettersEvent says which Event, if any, a change of status.deadLetters
// makes: DeadLettersPresent when parked rows appear where there were none
// (or none had been counted yet), NoDeadLetters when the last of them is
// gone. A count that grows or shrinks but stays above zero makes none, and
// neither does a failed check (it keeps the count).
func deadLettersEvent(old, now *int64) (v1alpha1.Reason, bool) {
	switch {
	case now == nil:
		return "", false
	case *now > 0 && ptr.Deref(old, 0) == 0:
		return v1alpha1.ReasonDeadLettersPresent, true
	case *now == 0 && ptr.Deref(old, 0) > 0:
		return v1alpha1.ReasonNoDeadLetters, true
	}
	return "", false
}

func (r *OutboxRelayReconciler) event(relay *v1alpha1.OutboxRelay, eventType, reason, action, note string) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(relay, nil, eventType, reason, action, "%s", note)
}
