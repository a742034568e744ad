package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/scaling"
)

// ControllerName names the controller in logs, metrics and Events.
const ControllerName = "outboxrelay"

// secretNameIndex is the field index that maps a Secret name to the
// OutboxRelays that reference it (postgres.dsnSecretRef.name and
// redis.urlSecretRef.name).
const secretNameIndex = ".spec.secretRefs.name"

// Retries of a failed reconcile back off exponentially between these.
const (
	retryBaseDelay = 500 * time.Millisecond
	retryMaxDelay  = 5 * time.Minute
)

// conflictRetryDelay is the wait before a reconcile that lost an optimistic
// lock runs again.
const conflictRetryDelay = 200 * time.Millisecond

// OutboxRelayReconciler reconciles OutboxRelays. Fill the exported fields,
// then call SetupWithManager.
type OutboxRelayReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	client.Client
	// APIReader reads from the API server without a cache: Secrets (whose
	// data the manager never caches) and children missing from the cache.
	APIReader client.Reader
	// MetadataReader reads the metadata of Secrets from the manager's cache
	// (mgr.GetCache()), to tell whether a Secret changed since it was last
	// read; nil reads every Secret from the API server on every reconcile.
	MetadataReader client.Reader
	// Scheme knows the OutboxRelay and the child kinds.
	Scheme *runtime.Scheme
	// Recorder emits Events.
	Recorder events.EventRecorder
	// RelayImage is the image of the relay pods when an OutboxRelay names
	// none.
	RelayImage string
	// Measurer measures backlogs; nil means a backlog.PoolMeasurer
	// configured by Pools. Tests swap in a fake.
	Measurer backlog.Measurer
	// Pools configures the default PoolMeasurer.
	Pools backlog.PoolMeasurerConfig
	// Checks configures the backlog Prober: its deadlines and bounds
	// (backlog.Config; zero fields take its defaults). SetupWithManager
	// sets Measurer, Notify and AllowDSNFileKeys.
	Checks backlog.Config
	// Metrics exports per-relay gauges; nil exports none.
	Metrics *RelayMetrics
	// Clock is the time source (default the real clock).
	Clock clock.PassiveClock
	// MaxConcurrentReconciles is the number of workers (default 8: a
	// reconcile mostly waits for the API server).
	MaxConcurrentReconciles int

	prober        *backlog.Prober
	probeStats    *probeCollector
	backlogEvents chan event.GenericEvent
	applied       appliedGenerations
	statuses      writtenStatuses
	secretCache   *secretCache
	slotDSNs      slotDSNs
}

// relayState is what one reconcile learns, step by step, and then writes.
type relayState struct {
	relay     *v1alpha1.OutboxRelay
	now       time.Time
	resources *relayResources

	table *outbox.Table
	// slot is the replication slot with source LogicalReplication, else "".
	slot           string
	specFailure    *failure
	secrets        *resolvedSecrets
	secretsFailure *failure
	// tableShared: other OutboxRelays of the namespace relay the same
	// table (outboxrelay_shared.go).
	tableShared *failure

	// backlog is nil when no check could be made (spec or secrets failed).
	backlog  *backlog.Observation
	decision scaling.Decision

	// deploymentWritten: the Deployment has decision.Replicas.
	deploymentWritten bool
	childFailure      *failure
}

// +kubebuilder:rbac:groups=relay.outbox.dev,resources=outboxrelays,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=relay.outbox.dev,resources=outboxrelays/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=relay.outbox.dev,resources=outboxrelays/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=list
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one OutboxRelay's children and status in line with its
// spec. It reads as a list: get the relay, gather the children, resolve the
// spec and the Secrets, observe the backlog, decide the replicas, write the
// children (once the prerequisites hold), write the status.
func (r *OutboxRelayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	relay := &v1alpha1.OutboxRelay{}
	if err := r.Get(ctx, req.NamespacedName, relay); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting OutboxRelay: %w", err)
	}
	if !relay.DeletionTimestamp.IsZero() {
		if controllerutil.ContainsFinalizer(relay, v1alpha1.FinalizerReplicationSlot) {
			// Source LogicalReplication: the slot goes first
			// (outboxrelay_replication.go).
			return r.finalize(ctx, relay)
		}
		// The children go with it (owner references); only memory is left.
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	if err := r.ensureFinalizer(ctx, relay); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
		}
		return ctrl.Result{}, err
	}

	// The status this process last wrote is at least as new as the cache's.
	r.statuses.restore(relay)

	st := &relayState{relay: relay, now: r.Clock.Now()}
	var err error
	if st.resources, err = r.getResources(ctx, relay); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.resolve(ctx, st); err != nil {
		return ctrl.Result{}, err
	}
	sharers, err := r.tableSharers(ctx, relay)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.tableShared = tableSharedFailure(relay, sharers)
	r.observeBacklog(st)
	r.decideReplicas(st)

	var childErr error
	if st.prerequisitesMet() && !st.reconcilePaused() {
		childErr = r.updateChildren(ctx, st)
	}
	if err := r.updateStatus(ctx, st); err != nil {
		return ctrl.Result{}, err
	}

	switch {
	case isConflict(childErr):
		log.V(1).Info("Retrying after a conflict on a child object", "error", childErr.Error())
		return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
	case childErr != nil:
		return ctrl.Result{}, childErr
	case st.secretsFailure != nil:
		// A missing prerequisite, not a failure of the reconcile: the
		// condition says what is missing, and it is looked at again after a
		// delay; creating or fixing the Secret triggers a reconcile at once
		// through the Secret watch.
		log.V(1).Info("Waiting for a prerequisite", "reason", st.secretsFailure.reason, "retryIn", prerequisiteRetryDelay)
		return ctrl.Result{RequeueAfter: prerequisiteRetryDelay}, nil
	case st.specFailure != nil:
		// Only a new spec can fix it, and that triggers a reconcile.
		return ctrl.Result{}, nil
	}
	after, routine := st.requeueAfter(r.prober.MaxCheckDuration())
	res := ctrl.Result{RequeueAfter: after}
	if routine {
		// A routine recheck waits behind the changes to other relays (a
		// new relay, a finished check, an edited child) when the work
		// queue is busy: under a burst, rechecking the relays measured
		// already would slow down measuring the new ones.
		res.Priority = ptr.To(handler.LowPriority)
	}
	return res, nil
}

// prerequisiteRetryDelay is how soon a relay whose Secrets are missing or
// wrong is looked at again when no watch event comes first.
const prerequisiteRetryDelay = 15 * time.Second

// isConflict reports whether every error joined in err is a conflict (or a
// cache behind a write): a reason to retry shortly, not a failure.
func isConflict(err error) bool {
	if err == nil {
		return false
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !isConflict(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err) || errors.Is(err, errCacheBehind)
}

// resolve validates the outbox layout and reads the Secrets.
func (r *OutboxRelayReconciler) resolve(ctx context.Context, st *relayState) error {
	pg := &st.relay.Spec.Postgres
	c := pg.Columns.GetColumns()
	table, err := outbox.New(pg.GetTable(), outbox.Columns{
		ID: c.ID, EventType: c.EventType, Payload: c.Payload, CreatedAt: c.CreatedAt, DispatchedAt: c.DispatchedAt, Key: c.Key,
	})
	if err != nil {
		st.specFailure = &failure{v1alpha1.ReasonInvalidSpec, "spec.postgres: " + err.Error()}
	} else {
		st.table = table
	}
	if st.relay.Spec.ReadsLogicalReplication() {
		st.slot = ReplicationSlotName(st.relay)
	}
	st.secrets, st.secretsFailure, err = r.resolveSecrets(ctx, st.relay)
	if st.slot != "" && st.secrets != nil {
		r.slotDSNs.put(client.ObjectKeyFromObject(st.relay), st.secrets.dsn)
	}
	return err
}

// reconcilePaused reports whether the relay's annotation pauses the writes
// to its children.
func (st *relayState) reconcilePaused() bool {
	return st.relay.Annotations[v1alpha1.AnnotationReconcile] == v1alpha1.ReconcileDisabled
}

// prerequisitesMet reports whether the children can be written: a usable
// layout and both Secrets.
func (st *relayState) prerequisitesMet() bool {
	return st.specFailure == nil && st.secretsFailure == nil && st.secrets != nil
}

// observeBacklog asks the Prober for the latest measurement; the Prober
// starts a check in the background when one is due and triggers a reconcile
// when it finishes. It never waits for the database.
func (r *OutboxRelayReconciler) observeBacklog(st *relayState) {
	if !st.prerequisitesMet() {
		return
	}
	obs := r.prober.Observe(client.ObjectKeyFromObject(st.relay),
		backlog.Target{DSN: st.secrets.dsn, Redis: redisTarget(st), Table: st.table, Stream: st.relay.Spec.Redis.GetStream(), Slot: st.slot},
		st.relay.Spec.Backlog.GetCheckInterval())
	st.backlog = &obs
}

// lastSuccess is the latest successful measurement of this reconcile's
// target, or nil.
func (st *relayState) lastSuccess() *backlog.Result {
	if st.backlog == nil || st.backlog.Last == nil || st.backlog.Last.Failure != nil {
		return nil
	}
	return st.backlog.Last
}

// decideReplicas applies the scaling policy to the latest backlog, with the
// stabilisation state kept in the status.
func (r *OutboxRelayReconciler) decideReplicas(st *relayState) {
	spec := &st.relay.Spec
	policy := scaling.Policy{
		Min:              spec.Replicas.GetMin(),
		Max:              spec.Replicas.GetMax(),
		TargetPerReplica: spec.Replicas.GetTargetBacklogPerReplica(),
		ScaleDownWindow:  spec.Replicas.GetScaleDownStabilizationWindow(),
	}
	if spec.ReadsLogicalReplication() {
		// One relay reads a slot at a time: more relays are standbys and
		// drain nothing faster, so replicas.max does not apply. And at
		// least one runs, even with replicas.min 0: the backlog of a slot
		// (rows created after its last published commit) misses rows of a
		// transaction that began before that commit, and rows of a
		// `timestamp` column written west of UTC, so it cannot be trusted
		// to wake a relay from zero; a slot nobody reads also holds WAL
		// until max_slot_wal_keep_size invalidates it.
		policy.Min = max(policy.Min, 1)
		policy.Max = policy.Min
	}
	var count *int64
	if last := st.lastSuccess(); last != nil {
		count = &last.Backlog.Count
	}
	if spec.Replicas.External() {
		// An autoscaler decides, through the scale subresource: its count
		// is the Deployment's (admission requires it in this mode).
		st.decision = scaling.Decision{Replicas: ptr.Deref(spec.Replicas.Count, 1)}
		if spec.ReadsLogicalReplication() {
			// Never zero, for the reason above: an autoscaler that scales
			// on a slot's backlog (KEDA at minReplicaCount 0) would leave
			// the rows that backlog misses unread.
			st.decision.Replicas = max(st.decision.Replicas, 1)
		}
		if spec.Suspend {
			st.decision.Replicas = 0
		}
		return
	}
	prev := scaling.State{Replicas: st.relay.Status.DesiredReplicas}
	if t := st.relay.Status.ScaleDownPendingSince; t != nil {
		prev.ScaleDownPendingSince = &t.Time
	}
	st.decision = scaling.Decide(policy, spec.Suspend, count, prev, st.now)
}

// requeueAfter is when this relay needs a reconcile although no watch will
// fire: the next backlog check, the end of a scale-down window, or the
// moment the oldest pending row would count as stalled. routine reports
// that the earliest is the backlog check (or the safety net of one in
// flight), which can wait behind other work.
func (st *relayState) requeueAfter(checkTimeout time.Duration) (d time.Duration, routine bool) {
	consider := func(x time.Duration, isRoutine bool) {
		if x > 0 && (d == 0 || x < d) {
			d, routine = x, isRoutine
		}
	}
	if st.backlog != nil {
		if st.backlog.InFlight {
			// The Prober triggers a reconcile when the check ends; this is
			// only a safety net, no sooner than the check interval: a check
			// may wait in the Prober's queue longer than it runs, and a
			// reconcile meanwhile would only observe it waiting.
			consider(max(checkTimeout+time.Second, st.relay.Spec.Backlog.GetCheckInterval()), true)
		} else {
			consider(st.backlog.NextCheckIn, true)
		}
	}
	consider(st.decision.RecheckAfter, false)
	if last := st.lastSuccess(); last != nil && last.Backlog.Oldest != nil {
		consider(last.Backlog.Oldest.Add(st.relay.Spec.Backlog.GetStalledAfter()).Sub(st.now)+time.Second, false)
	}
	return d, routine
}

// forget drops what the process holds for a deleted OutboxRelay: its share
// of a connection pool, its remembered generations, its metrics.
func (r *OutboxRelayReconciler) forget(key types.NamespacedName) {
	r.prober.Forget(key)
	r.applied.forget(key)
	r.statuses.forget(key)
	r.secretCache.forget(key)
	r.slotDSNs.forget(key)
	if r.Metrics != nil {
		r.Metrics.Delete(key)
	}
}

// notifyBacklog turns a finished backlog check into a reconcile of its
// relay. It is called from the check's goroutine and gives up when the
// Prober stops.
func (r *OutboxRelayReconciler) notifyBacklog(ctx context.Context, key types.NamespacedName) {
	ev := event.GenericEvent{Object: &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
	}}
	select {
	case r.backlogEvents <- ev:
	case <-ctx.Done():
	}
}

// skipCreates ignores the creation of a child: the controller created it
// itself, in a reconcile that already accounted for it (and at start-up
// every OutboxRelay is reconciled anyway). Updates (a rollout, an edit by
// hand) and deletions still trigger a reconcile.
var skipCreates = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
}

// indexSecretNames is the secretNameIndex function.
func indexSecretNames(obj client.Object) []string {
	relay, ok := obj.(*v1alpha1.OutboxRelay)
	if !ok {
		return nil
	}
	names := []string{relay.Spec.Postgres.DSNSecretRef.Name}
	for _, ref := range []*v1alpha1.SecretKeyReference{&relay.Spec.Redis.URLSecretRef, relay.Spec.Redis.CASecretRef} {
		if ref != nil && !slices.Contains(names, ref.Name) {
			names = append(names, ref.Name)
		}
	}
	return names
}

// relaysForSecret maps a Secret to the OutboxRelays of its namespace that
// reference it.
func (r *OutboxRelayReconciler) relaysForSecret(ctx context.Context, secret client.Object) []reconcile.Request {
	var list v1alpha1.OutboxRelayList
	if err := r.List(ctx, &list, client.InNamespace(secret.GetNamespace()),
		client.MatchingFields{secretNameIndex: secret.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "Failed to list the OutboxRelays of a Secret",
			"secret", client.ObjectKeyFromObject(secret))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// SetupWithManager registers the field index, the backlog Prober and the
// controller with mgr. The controller watches OutboxRelays (spec changes),
// the Deployments and CronJobs they own, the metadata of Secrets (never
// their data: Secret events are mapped to relays through the field index),
// and the Prober's finished checks.
func (r *OutboxRelayReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.MaxConcurrentReconciles <= 0 {
		r.MaxConcurrentReconciles = 8
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.MetadataReader == nil {
		r.MetadataReader = mgr.GetCache()
	}
	r.secretCache = newSecretCache()
	if r.Measurer == nil {
		r.Measurer = backlog.NewPoolMeasurer(r.Pools)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.OutboxRelay{}, secretNameIndex, indexSecretNames); err != nil {
		return fmt.Errorf("indexing OutboxRelays by Secret name: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.OutboxRelay{}, tableIndex, indexTableKey); err != nil {
		return fmt.Errorf("indexing OutboxRelays by table: %w", err)
	}

	r.backlogEvents = make(chan event.GenericEvent, 1024)
	checks := r.Checks
	checks.Measurer = r.Measurer
	checks.Notify = r.notifyBacklog
	checks.AllowDSNFileKeys = r.Pools.AllowFileKeys
	r.prober = backlog.NewProber(checks)
	if err := mgr.Add(r.prober); err != nil {
		return fmt.Errorf("adding the backlog prober: %w", err)
	}
	if r.Metrics != nil {
		r.Metrics.Now = r.Clock.Now
	}
	r.probeStats = newProbeCollector(r.prober, r.Measurer)

	return ctrl.NewControllerManagedBy(mgr).
		// The spec, and the annotations (the reconcile pause).
		For(&v1alpha1.OutboxRelay{}, builder.WithPredicates(
			predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// The other relays of a table: a new one, or one gone, changes
		// whether the table is shared (outboxrelay_shared.go).
		Watches(&v1alpha1.OutboxRelay{}, handler.EnqueueRequestsFromMapFunc(r.relaysSharingTable),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}, builder.WithPredicates(skipCreates)).
		Owns(&batchv1.CronJob{}, builder.WithPredicates(skipCreates)).
		WatchesMetadata(&corev1.Secret{},
			handler.EnqueueRequestsFromMapFunc(r.relaysForSecret),
			builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		WatchesRawSource(source.Channel(r.backlogEvents, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: r.MaxConcurrentReconciles,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](retryBaseDelay, retryMaxDelay),
		}).
		Named(ControllerName).
		Complete(r)
}
