package controller

// The write path: whether and how a child object is written. Reading the
// children is outboxrelay_resources.go; building them is deployment.go and
// cronjob.go.
//
// Why not server-side apply: an apply of every child on every reconcile
// would drop the spec hash and the generation tracking below, but it is a
// request to the API server per child per reconcile even when nothing
// changed, and a reconcile follows every backlog check of every relay (1,000
// relays checked every 30 s would be some 70 apply requests a second, each
// decoded, diffed against managedFields and admitted by the API server). The
// hash decides locally that nothing changed, which is the common case; the
// generation tells an edit by hand (put back) from a cache that is behind
// (waited for). The tests of outboxrelay_update_test.go and the envtest
// suite pin both behaviours, and the scale benchmarks count the writes.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// annotationRestartedAt is what `kubectl rollout restart` adds to a pod
// template; the operator keeps it, so such a restart is not undone.
const annotationRestartedAt = "kubectl.kubernetes.io/restartedAt"

// appliedGenerations remembers, per OutboxRelay and kind of child, the
// object this process last wrote and the generation the write produced.
//
//   - A cached child of that generation is as written: nothing to do.
//   - A cached child of an older generation is a cache that has not caught
//     up with the write yet: nothing to do either (the watch event follows).
//   - A cached child of a newer generation was changed by someone else: it
//     is written again. That is how edits by hand are put back without
//     writing every child on every reconcile.
//
// After a restart the map is empty, so each child is written once.
type appliedGenerations struct {
	mu      sync.Mutex
	written map[types.NamespacedName]map[string]writtenChild // by OutboxRelay, then kind
}

// writtenChild is what a write left.
type writtenChild struct {
	uid        types.UID
	generation int64
	specHash   string
}

// errCacheBehind says that a child must change but the cache has not caught
// up with the previous write yet; the reconcile is retried shortly.
var errCacheBehind = errors.New("the cache has not caught up with the last write yet")

// lookup returns what was last written of a kind for a relay.
func (a *appliedGenerations) lookup(relay types.NamespacedName, kind string) (writtenChild, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.written[relay][kind]
	return w, ok
}

func (a *appliedGenerations) record(relay types.NamespacedName, kind string, obj client.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.written == nil {
		a.written = map[types.NamespacedName]map[string]writtenChild{}
	}
	if a.written[relay] == nil {
		a.written[relay] = map[string]writtenChild{}
	}
	a.written[relay][kind] = writtenChild{
		uid: obj.GetUID(), generation: obj.GetGeneration(), specHash: obj.GetAnnotations()[AnnotationSpecHash],
	}
}

func (a *appliedGenerations) forget(relay types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.written, relay)
}

// childKind describes how to write one kind of child.
type childKind[T client.Object] struct {
	name string
	// copySpec copies the spec the operator owns from src into dst.
	copySpec func(dst, src T)
	// spec returns what the spec hash covers.
	spec func(T) any
}

var deploymentKind = childKind[*appsv1.Deployment]{
	name: "Deployment",
	copySpec: func(dst, src *appsv1.Deployment) {
		restartedAt, restarted := dst.Spec.Template.Annotations[annotationRestartedAt]
		dst.Spec = *src.Spec.DeepCopy()
		if restarted {
			if dst.Spec.Template.Annotations == nil {
				dst.Spec.Template.Annotations = map[string]string{}
			}
			dst.Spec.Template.Annotations[annotationRestartedAt] = restartedAt
		}
	},
	spec: func(d *appsv1.Deployment) any { return d.Spec },
}

var cronJobKind = childKind[*batchv1.CronJob]{
	name:     "CronJob",
	copySpec: func(dst, src *batchv1.CronJob) { dst.Spec = *src.Spec.DeepCopy() },
	spec:     func(c *batchv1.CronJob) any { return c.Spec },
}

// writeChild makes the child object match desired: it creates it when
// missing, and updates it when what the operator last wrote differs from
// desired, or when someone else changed it since (its generation, its labels
// or its owner). Otherwise it writes nothing and returns existing.
//
// The update replaces the whole spec: an edit by hand is put back, fields
// that the API server defaults are defaulted again.
func writeChild[T client.Object](ctx context.Context, r *OutboxRelayReconciler, kind childKind[T],
	relay *v1alpha1.OutboxRelay, existing, desired T, exists bool,
) (T, error) {
	log := logf.FromContext(ctx)
	relayKey := client.ObjectKeyFromObject(relay)
	var zero T

	hash, err := specHash(desired.GetLabels(), kind.spec(desired))
	if err != nil {
		return zero, err
	}
	setAnnotation(desired, AnnotationSpecHash, hash)
	if err := controllerutil.SetControllerReference(relay, desired, r.Scheme); err != nil {
		return zero, fmt.Errorf("setting owner of %s: %w", kind.name, err)
	}

	if !exists {
		err := r.Create(ctx, desired)
		if err == nil {
			log.Info("Created "+kind.name, "name", desired.GetName())
			r.applied.record(relayKey, kind.name, desired)
			return desired, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return zero, err
		}
		// Not in the cache but on the server: its labels were removed, so
		// the label-filtered cache lost it. Read it directly and fix it.
		existing = desired.DeepCopyObject().(T)
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(desired), existing); err != nil {
			return zero, fmt.Errorf("reading %s after it already existed: %w", kind.name, err)
		}
	}

	if owner := metav1.GetControllerOf(existing); owner != nil && owner.UID != relay.UID {
		return zero, fmt.Errorf("%s %q already exists and is controlled by %s %q; delete it or rename the OutboxRelay",
			kind.name, existing.GetName(), owner.Kind, owner.Name)
	}
	if w, ok := r.applied.lookup(relayKey, kind.name); ok && w.uid == existing.GetUID() && existing.GetGeneration() < w.generation {
		// The cache has not seen the last write yet; its event will come.
		if w.specHash == hash {
			return existing, nil
		}
		return zero, fmt.Errorf("%s %q: %w", kind.name, existing.GetName(), errCacheBehind)
	}
	if !needsWrite(r, relayKey, kind.name, relay, existing, hash, desired.GetLabels()) {
		return existing, nil
	}

	updated := existing.DeepCopyObject().(T)
	labels := updated.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, desired.GetLabels())
	updated.SetLabels(labels)
	setAnnotation(updated, AnnotationSpecHash, hash)
	updated.SetOwnerReferences(desired.GetOwnerReferences())
	kind.copySpec(updated, desired)
	if err := r.Update(ctx, updated); err != nil {
		return zero, err
	}
	if updated.GetResourceVersion() != existing.GetResourceVersion() {
		log.Info("Updated "+kind.name, "name", updated.GetName(), "generation", updated.GetGeneration())
	}
	r.applied.record(relayKey, kind.name, updated)
	return updated, nil
}

// needsWrite reports whether an existing child differs from what the
// operator wants, judged without comparing server-defaulted fields.
func needsWrite(r *OutboxRelayReconciler, relayKey types.NamespacedName, kind string, relay *v1alpha1.OutboxRelay,
	existing client.Object, hash string, labels map[string]string,
) bool {
	if existing.GetAnnotations()[AnnotationSpecHash] != hash {
		return true
	}
	if w, ok := r.applied.lookup(relayKey, kind); !ok || w.uid != existing.GetUID() || w.generation != existing.GetGeneration() {
		return true
	}
	if owner := metav1.GetControllerOf(existing); owner == nil || owner.UID != relay.UID {
		return true
	}
	have := existing.GetLabels()
	for k, v := range labels {
		if have[k] != v {
			return true
		}
	}
	return false
}

// specHash hashes what the operator writes to a child.
func specHash(labels map[string]string, spec any) (string, error) {
	raw, err := json.Marshal(struct {
		Labels map[string]string `json:"labels"`
		Spec   any               `json:"spec"`
	}{labels, spec})
	if err != nil {
		return "", fmt.Errorf("hashing spec: %w", err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:16]), nil
}

func setAnnotation(obj client.Object, key, value string) {
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
}

// updateChildren writes the Deployment and the CronJob. A failure of one is
// recorded in st (a condition) and returned; the other is still written.
func (r *OutboxRelayReconciler) updateChildren(ctx context.Context, st *relayState) error {
	relay := st.relay
	var errs []error

	dep := RelayDeployment(relay, r.RelayImage, st.secrets.hash, st.decision.Replicas)
	written, err := writeChild(ctx, r, deploymentKind, relay, st.resources.deployment, dep, st.resources.deployment != nil)
	switch {
	case isConflict(err):
		// Someone wrote it since the cache saw it: retry, nothing is wrong.
		errs = append(errs, fmt.Errorf("writing Deployment: %w", err))
	case err != nil:
		st.childFailure = &failure{v1alpha1.ReasonDeploymentFailed, fmt.Sprintf("writing Deployment %q: %v", dep.Name, err)}
		errs = append(errs, fmt.Errorf("writing Deployment: %w", err))
	default:
		st.resources.deployment = written
		st.deploymentWritten = true
	}

	if relay.Spec.Cleanup.DeletesOnDispatch() {
		// The relays delete what they publish: no CronJob, and one left
		// from the other mode goes. (Source LogicalReplication keeps one:
		// `relay cleanup --slot` deletes streamed rows by age.)
		if err := r.deleteCronJob(ctx, st); err != nil {
			if st.childFailure == nil {
				st.childFailure = &failure{v1alpha1.ReasonCronJobFailed, fmt.Sprintf("deleting CronJob %q: %v", CronJobName(relay), err)}
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	cj := CleanupCronJob(relay, r.RelayImage)
	writtenCJ, err := writeChild(ctx, r, cronJobKind, relay, st.resources.cronJob, cj, st.resources.cronJob != nil)
	switch {
	case isConflict(err):
		errs = append(errs, fmt.Errorf("writing CronJob: %w", err))
	case err != nil:
		if st.childFailure == nil {
			st.childFailure = &failure{v1alpha1.ReasonCronJobFailed, fmt.Sprintf("writing CronJob %q: %v", cj.Name, err)}
		}
		errs = append(errs, fmt.Errorf("writing CronJob: %w", err))
	default:
		st.resources.cronJob = writtenCJ
	}
	return errors.Join(errs...)
}

// deleteCronJob deletes the cleanup CronJob when there is one (cleanup mode
// OnDispatch); its Jobs go with it (background
// propagation).
func (r *OutboxRelayReconciler) deleteCronJob(ctx context.Context, st *relayState) error {
	cj := st.resources.cronJob
	if cj == nil {
		return nil
	}
	err := r.Delete(ctx, cj, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &cj.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting CronJob: %w", err)
	}
	st.resources.cronJob = nil
	return nil
}
