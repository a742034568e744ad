package controller

// Source LogicalReplication (spec.source): the relay flags, the slot's
// status and condition, and the finalizer that drops the slot when the
// OutboxRelay is deleted. The slot's name is labels.go's
// ReplicationSlotName.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
)

// walStatusLost is pg_replication_slots.wal_status of an invalidated slot.
const walStatusLost = "lost"

// Timings of the finalizer.
const (
	// slotDropTimeout bounds the connection that drops a slot, and the drop
	// (which may first terminate a walsender still holding it).
	slotDropTimeout = 10 * time.Second
	// relayPodsPollInterval is how often a deletion looks again whether the
	// relay pods are gone (the controller does not watch pods).
	relayPodsPollInterval = 2 * time.Second
)

// sourceArgs are the flags of spec.source: none for Polling (the default
// adds no flag, so relays do not roll when the operator is upgraded).
func sourceArgs(relay *v1alpha1.OutboxRelay) []string {
	if !relay.Spec.ReadsLogicalReplication() {
		return nil
	}
	return []string{"--source=" + string(v1alpha1.SourceLogicalReplication), "--slot=" + ReplicationSlotName(relay)}
}

// replicationStatus is status.replication: the slot's name, and what the
// last successful check read of it. nil with source Polling.
func replicationStatus(st *relayState, old *v1alpha1.ReplicationStatus) *v1alpha1.ReplicationStatus {
	if st.slot == "" {
		return nil
	}
	rs := &v1alpha1.ReplicationStatus{SlotName: st.slot}
	if old != nil && old.SlotName == st.slot {
		rs = old.DeepCopy()
	}
	last := st.lastSuccess()
	if last == nil || last.Slot == nil {
		return rs
	}
	s := last.Slot.Status
	rs = &v1alpha1.ReplicationStatus{
		SlotName:                st.slot,
		SlotExists:              s.Exists,
		MaxSlotWALKeepSizeBytes: ptr.To(last.Slot.MaxWALKeepSize),
	}
	if s.Exists {
		rs.Active = s.Active
		rs.WALStatus = s.WALStatus
		rs.RetainedBytes = ptr.To(s.RetainedBytes)
		rs.LagBytes = ptr.To(s.LagBytes)
		if s.SafeWALSize != nil {
			rs.SafeWALSizeBytes = ptr.To(*s.SafeWALSize)
		}
	}
	return rs
}

// replicationSlotCondition judges status.replication against
// logicalReplication.maxRetainedWAL and the server's bound. Its messages
// hold sizes only where they are the news (retaining WAL), so that a
// healthy slot's condition does not change at every check.
func replicationSlotCondition(st *relayState, s *v1alpha1.OutboxRelayStatus) condition {
	if st.backlog != nil && st.backlog.Last != nil && st.backlog.Last.Failure != nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the last backlog check failed")
	}
	rs := s.Replication
	if rs == nil || rs.MaxSlotWALKeepSizeBytes == nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the replication slot has not been checked yet")
	}
	slot := rs.SlotName
	limit := st.relay.Spec.LogicalReplication.GetMaxRetainedWAL()
	keep := *rs.MaxSlotWALKeepSizeBytes
	switch {
	case !rs.SlotExists:
		return unknownCondition(v1alpha1.ReasonSlotMissing, fmt.Sprintf(
			"replication slot %s does not exist yet: the relays create it (and the publication %s) when they start",
			slot, publicationName(st)))
	case rs.WALStatus == walStatusLost:
		return falseCondition(v1alpha1.ReasonSlotInvalidated, fmt.Sprintf(
			"replication slot %s was invalidated (wal_status lost): the server removed WAL it still needed, because it kept "+
				"more than max_slot_wal_keep_size (%s); the relays drop and recreate it and catch up from table %s, "+
				"so no event is lost, but events committed since the slot's last confirmed position may be published twice",
			slot, formatBytes(keep), tableName(st)))
	case ptr.Deref(rs.RetainedBytes, 0) > limit:
		return falseCondition(v1alpha1.ReasonSlotRetainingWAL, fmt.Sprintf(
			"replication slot %s keeps %s of WAL on the server, more than logicalReplication.maxRetainedWAL (%s): "+
				"its relay is stopped, slow or cannot confirm (see RelaysAvailable and the relays' logs); the WAL stays "+
				"until the relay confirms, or the slot is dropped%s",
			slot, formatBytes(*rs.RetainedBytes), formatBytes(limit), keepSizeClause(keep)))
	case keep < 0:
		return falseCondition(v1alpha1.ReasonSlotWALUnbounded, fmt.Sprintf(
			"the server's max_slot_wal_keep_size is unset (-1): if the relays stop, replication slot %s keeps WAL until "+
				"the server's disk is full; set it above logicalReplication.maxRetainedWAL (%s), for example "+
				"ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf(); (a managed service's "+
				"parameter group): past it the server invalidates the slot instead, and the relays recreate it and "+
				"catch up from the table", slot, formatBytes(limit)))
	}
	return trueCondition(v1alpha1.ReasonSlotHealthy,
		"replication slot %s keeps less WAL than logicalReplication.maxRetainedWAL (%s), and max_slot_wal_keep_size (%s) bounds it",
		slot, formatBytes(limit), formatBytes(keep))
}

// keepSizeClause says what happens at the server's bound.
func keepSizeClause(keep int64) string {
	if keep < 0 {
		return "; max_slot_wal_keep_size is unset, so nothing bounds it short of a full disk"
	}
	return fmt.Sprintf("; past max_slot_wal_keep_size (%s) the server invalidates the slot", formatBytes(keep))
}

// publicationName is the publication the relays stream the table through.
func publicationName(st *relayState) string {
	if st.table == nil {
		return "of the table"
	}
	return st.table.PublicationName()
}

func tableName(st *relayState) string {
	if st.table == nil {
		return st.relay.Spec.Postgres.GetTable()
	}
	return st.table.String()
}

// formatBytes writes a size of WAL as a person reads it.
func formatBytes(n int64) string {
	const (
		ki = 1 << 10
		mi = 1 << 20
		gi = 1 << 30
	)
	switch {
	case n < 0:
		return "unset"
	case n >= gi:
		return fmt.Sprintf("%.1f GiB", float64(n)/gi)
	case n >= mi:
		return fmt.Sprintf("%.1f MiB", float64(n)/mi)
	case n >= ki:
		return fmt.Sprintf("%.1f KiB", float64(n)/ki)
	}
	return fmt.Sprintf("%d bytes", n)
}

// setReplicationSlot sets ReplicationSlotHealthy with source
// LogicalReplication, and removes it otherwise.
func setReplicationSlot(st *relayState, s *v1alpha1.OutboxRelayStatus, c condition) {
	if st.slot == "" {
		meta.RemoveStatusCondition(&s.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy))
		return
	}
	setCondition(s, v1alpha1.ConditionReplicationSlotHealthy, c, st.relay.Generation, st.now)
}

// setCondition sets one condition of s.
func setCondition(s *v1alpha1.OutboxRelayStatus, t v1alpha1.ConditionType, c condition, generation int64, now time.Time) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               string(t),
		Status:             c.status,
		Reason:             string(c.reason),
		Message:            c.message,
		ObservedGeneration: generation,
		LastTransitionTime: *metaTime(now),
	})
}

// replicationSlotEvent says which Event, if any, a change of
// ReplicationSlotHealthy makes: one per new reason, none while it waits
// for a check, and none for a first check that finds the slot healthy or
// not there yet.
func replicationSlotEvent(old, now *metav1.Condition) (v1alpha1.Reason, bool) {
	if now == nil || now.Reason == string(v1alpha1.ReasonBacklogUnknown) {
		return "", false
	}
	if old != nil && old.Reason == now.Reason && old.Status == now.Status {
		return "", false
	}
	first := old == nil || old.Reason == string(v1alpha1.ReasonBacklogUnknown)
	if first && (now.Reason == string(v1alpha1.ReasonSlotHealthy) || now.Reason == string(v1alpha1.ReasonSlotMissing)) {
		return "", false
	}
	return v1alpha1.Reason(now.Reason), true
}

// recordSlotTransition logs and emits the Event of a ReplicationSlotHealthy
// change.
func (r *OutboxRelayReconciler) recordSlotTransition(
	ctx context.Context, relay *v1alpha1.OutboxRelay, old, now *v1alpha1.OutboxRelayStatus,
) {
	oldC := meta.FindStatusCondition(old.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy))
	nowC := meta.FindStatusCondition(now.Conditions, string(v1alpha1.ConditionReplicationSlotHealthy))
	reason, ok := replicationSlotEvent(oldC, nowC)
	if !ok {
		return
	}
	logf.FromContext(ctx).Info("Changed ReplicationSlotHealthy condition", "status", nowC.Status, "reason", nowC.Reason)
	eventType := corev1.EventTypeNormal
	if reason.IsFailure() {
		eventType = corev1.EventTypeWarning
	}
	r.event(relay, eventType, string(reason), "CheckReplicationSlot", nowC.Message)
}

// slotDSNs remembers the DSN each relay of source LogicalReplication last
// resolved, in memory only: deleting a namespace deletes its Secrets and
// its OutboxRelays at once, and the finalizer still has to reach the
// database to drop the slot.
type slotDSNs struct {
	mu   sync.Mutex
	dsns map[types.NamespacedName]string
}

func (d *slotDSNs) put(key types.NamespacedName, dsn string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dsns == nil {
		d.dsns = map[types.NamespacedName]string{}
	}
	d.dsns[key] = dsn
}

func (d *slotDSNs) get(key types.NamespacedName) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dsn, ok := d.dsns[key]
	return dsn, ok
}

func (d *slotDSNs) forget(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dsns, key)
}

// ensureFinalizer adds the replication-slot finalizer to a relay of source
// LogicalReplication, before the relays that create the slot exist, so
// that no slot outlives its OutboxRelay unnoticed. After a write the relay
// holds the server's answer.
func (r *OutboxRelayReconciler) ensureFinalizer(ctx context.Context, relay *v1alpha1.OutboxRelay) error {
	if !relay.Spec.ReadsLogicalReplication() || controllerutil.ContainsFinalizer(relay, v1alpha1.FinalizerReplicationSlot) {
		return nil
	}
	before := relay.DeepCopy()
	controllerutil.AddFinalizer(relay, v1alpha1.FinalizerReplicationSlot)
	if err := r.Patch(ctx, relay, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("adding finalizer %s: %w", v1alpha1.FinalizerReplicationSlot, err)
	}
	logf.FromContext(ctx).Info("Added finalizer", "finalizer", v1alpha1.FinalizerReplicationSlot)
	return nil
}

// finalize runs when a relay of source LogicalReplication is deleted: it
// stops the relays (the Deployment deleted, then no ReplicaSet or relay pod
// left: a relay still running would create the slot again), drops the slot over
// a connection like the backlog check's, and removes the finalizer. When
// the slot cannot be dropped the finalizer stays, the conditions say why
// and how to finish by hand, and the drop is retried with backoff.
func (r *OutboxRelayReconciler) finalize(ctx context.Context, relay *v1alpha1.OutboxRelay) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	key := client.ObjectKeyFromObject(relay)
	r.statuses.restore(relay)
	slot := ReplicationSlotName(relay)

	pods, err := r.stopRelays(ctx, relay)
	if err != nil {
		return ctrl.Result{}, err
	}
	if pods > 0 {
		msg := fmt.Sprintf("the OutboxRelay is being deleted: waiting for the relay Deployment, its ReplicaSets and pods "+
			"(%d left) to be gone before dropping replication slot %s", pods, slot)
		if err := r.writeFinalizingStatus(ctx, relay, unknownCondition(v1alpha1.ReasonSlotDropPending, msg)); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: relayPodsPollInterval}, nil
	}

	if f := r.dropSlot(ctx, relay, slot); f != nil {
		cond := falseCondition(v1alpha1.ReasonSlotDropFailed, fmt.Sprintf(
			"the OutboxRelay is being deleted, but replication slot %s could not be dropped: %s; the operator retries. "+
				"To finish by hand, drop it on the database (SELECT pg_drop_replication_slot('%s');) and remove the finalizer: "+
				"kubectl patch outboxrelay %s -n %s --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]'",
			slot, f.message, slot, relay.Name, relay.Namespace))
		if err := r.writeFinalizingStatus(ctx, relay, cond); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, f
	}
	log.Info("Dropped replication slot", "slot", slot)
	r.event(relay, corev1.EventTypeNormal, string(v1alpha1.ReasonSlotDropped), "DropReplicationSlot",
		fmt.Sprintf("dropped replication slot %s", slot))

	before := relay.DeepCopy()
	controllerutil.RemoveFinalizer(relay, v1alpha1.FinalizerReplicationSlot)
	if err := r.Patch(ctx, relay, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(key)
			return ctrl.Result{}, nil
		}
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
		}
		return ctrl.Result{}, fmt.Errorf("removing finalizer %s: %w", v1alpha1.FinalizerReplicationSlot, err)
	}
	log.Info("Removed finalizer", "finalizer", v1alpha1.FinalizerReplicationSlot)
	r.forget(key)
	return ctrl.Result{}, nil
}

// stopRelays deletes the relay Deployment and returns how many of its
// objects that can run a relay still exist: the Deployment while it is
// being deleted, its ReplicaSets and the relay pods (read from the API
// server: the manager caches none of them). The Deployment is deleted, not
// scaled to zero: an autoscaler of replicas.mode External, or a ReplicaSet
// that had not yet seen the scale-down, could start a relay after the pods
// were counted, and that relay would create the slot again after its drop,
// keeping WAL with nobody left to drop it. Once the Deployment and its
// ReplicaSets are gone nothing starts a relay; the garbage collector
// removes them (background propagation), and the pods last.
func (r *OutboxRelayReconciler) stopRelays(ctx context.Context, relay *v1alpha1.OutboxRelay) (int, error) {
	// Uncached: the cache holds the Deployments that carry the operator's
	// labels, and one whose labels were edited must still be deleted.
	dep, err := getOrNil(ctx, r.APIReader, types.NamespacedName{Namespace: relay.Namespace, Name: DeploymentName(relay)}, &appsv1.Deployment{})
	if err != nil {
		return 0, fmt.Errorf("getting Deployment: %w", err)
	}
	if dep != nil && metav1.IsControlledBy(dep, relay) {
		if dep.DeletionTimestamp.IsZero() {
			err := r.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &dep.UID})
			if err != nil && !apierrors.IsNotFound(err) {
				return 0, fmt.Errorf("deleting Deployment %s: %w", dep.Name, err)
			}
			logf.FromContext(ctx).Info("Deleted the relay Deployment before dropping the replication slot", "name", dep.Name)
		}
		return 1, nil // looked at again next time
	}
	selector := client.MatchingLabels(selectorLabels(relay, ComponentRelay))
	left := 0
	for _, kind := range []schema.GroupVersionKind{
		appsv1.SchemeGroupVersion.WithKind("ReplicaSetList"), corev1.SchemeGroupVersion.WithKind("PodList"),
	} {
		var list metav1.PartialObjectMetadataList
		list.SetGroupVersionKind(kind)
		if err := r.APIReader.List(ctx, &list, client.InNamespace(relay.Namespace), selector); err != nil {
			return 0, fmt.Errorf("listing relay %s: %w", strings.TrimSuffix(kind.Kind, "List"), err)
		}
		left += len(list.Items)
	}
	return left, nil
}

// dropSlot drops the relay's slot; a failure is safe to show.
func (r *OutboxRelayReconciler) dropSlot(ctx context.Context, relay *v1alpha1.OutboxRelay, slot string) *failure {
	key := client.ObjectKeyFromObject(relay)
	st := &relayState{relay: relay, now: r.Clock.Now()}
	if err := r.resolve(ctx, st); err != nil {
		return &failure{v1alpha1.ReasonSlotDropFailed, "the Secrets could not be read: " + err.Error()}
	}
	if st.specFailure != nil {
		return st.specFailure
	}
	dsn := ""
	switch {
	case st.secrets != nil:
		dsn = st.secrets.dsn
	default:
		remembered, ok := r.slotDSNs.get(key)
		if !ok {
			return &failure{v1alpha1.ReasonSlotDropFailed, "the DSN is not available (" + st.secretsFailure.message + ")"}
		}
		dsn = remembered
	}
	dropper, ok := r.Measurer.(backlog.SlotDropper)
	if !ok {
		return &failure{v1alpha1.ReasonSlotDropFailed, "the operator's backlog measurer cannot drop slots"}
	}
	err := dropper.DropSlot(ctx, key, backlog.Target{DSN: dsn, Table: st.table, Slot: slot}, slotDropTimeout)
	if err == nil {
		return nil
	}
	var f *backlog.Failure
	if errors.As(err, &f) {
		return &failure{v1alpha1.ReasonSlotDropFailed, f.Message}
	}
	// Not a Failure: no message of it is shown, it may quote the DSN.
	return &failure{v1alpha1.ReasonSlotDropFailed, "the drop failed"}
}

// writeFinalizingStatus writes ReplicationSlotHealthy and Ready during a
// deletion, only when they changed, with an Event when the reason changes.
func (r *OutboxRelayReconciler) writeFinalizingStatus(ctx context.Context, relay *v1alpha1.OutboxRelay, c condition) error {
	status := relay.Status.DeepCopy()
	now := r.Clock.Now()
	setCondition(status, v1alpha1.ConditionReplicationSlotHealthy, c, relay.Generation, now)
	ready := c
	if ready.status == metav1.ConditionTrue {
		ready.status = metav1.ConditionFalse
	}
	setCondition(status, v1alpha1.ConditionReady, ready, relay.Generation, now)
	if equality.Semantic.DeepEqual(&relay.Status, status) {
		return nil
	}
	old := relay.Status.DeepCopy()
	before := relay.DeepCopy()
	relay.Status = *status
	if err := r.Status().Patch(ctx, relay, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status: %w", err)
	}
	r.statuses.record(relay)
	r.recordSlotTransition(ctx, relay, old, status)
	return nil
}
