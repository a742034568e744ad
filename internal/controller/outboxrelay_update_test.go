package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// The write decisions of the write path, as a table: needsWrite decides
// from the child as cached, what this process last wrote and the spec hash.
// (writeChild's client calls are covered against a real API server by the
// controller's envtest suite: DeploymentDeletedOrEditedIsRestored and the
// others.)
func TestNeedsWrite(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	relay.UID = "relay-uid"
	key := client.ObjectKeyFromObject(relay)
	owned := []metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "OutboxRelay", Name: "orders", UID: relay.UID,
		Controller: new(true),
	}}
	labels := map[string]string{LabelManagedBy: ManagedByOperator, LabelInstance: "orders"}
	child := func(change func(*appsv1.Deployment)) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{
			Name: "orders-relay", Namespace: "shop", UID: "child-uid", Generation: 3,
			Labels:          map[string]string{LabelManagedBy: ManagedByOperator, LabelInstance: "orders", "extra": "kept"},
			Annotations:     map[string]string{AnnotationSpecHash: "h1"},
			OwnerReferences: owned,
		}}
		if change != nil {
			change(d)
		}
		return d
	}
	written := child(nil) // what this process wrote last: generation 3, hash h1

	for _, tc := range []struct {
		name     string
		recorded bool // whether this process wrote the child before
		existing *appsv1.Deployment
		hash     string
		want     bool
	}{
		{"AsWritten", true, child(nil), "h1", false},
		{"SpecChanged", true, child(nil), "h2", true},
		{"EditedByHand", true, child(func(d *appsv1.Deployment) { d.Generation = 4 }), "h1", true},
		{"HashAnnotationRemoved", true, child(func(d *appsv1.Deployment) { d.Annotations = nil }), "h1", true},
		{"LabelRemoved", true, child(func(d *appsv1.Deployment) { delete(d.Labels, LabelInstance) }), "h1", true},
		{"LabelChanged", true, child(func(d *appsv1.Deployment) { d.Labels[LabelInstance] = "other" }), "h1", true},
		{"OwnerRemoved", true, child(func(d *appsv1.Deployment) { d.OwnerReferences = nil }), "h1", true},
		{"OwnedByAnotherRelay", true, child(func(d *appsv1.Deployment) {
			d.OwnerReferences = []metav1.OwnerReference{{Kind: "OutboxRelay", Name: "orders", UID: "old-uid", Controller: new(true)}}
		}), "h1", true},
		{"RecreatedUnderTheSameName", true, child(func(d *appsv1.Deployment) { d.UID = "new-uid" }), "h1", true},
		{"NotWrittenByThisProcess", false, child(nil), "h1", true}, // after a restart: written once
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &OutboxRelayReconciler{}
			if tc.recorded {
				r.applied.record(key, deploymentKind.name, written)
			}
			require.Equal(t, tc.want, needsWrite(r, key, deploymentKind.name, relay, tc.existing, tc.hash, labels))
		})
	}
}

func TestAppliedGenerations(t *testing.T) {
	t.Parallel()
	var a appliedGenerations
	relay := types.NamespacedName{Namespace: "shop", Name: "orders"}
	_, ok := a.lookup(relay, "Deployment")
	require.False(t, ok, "nothing recorded yet")

	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{UID: "u1", Generation: 2, Annotations: map[string]string{AnnotationSpecHash: "h"}}}
	a.record(relay, "Deployment", d)
	w, ok := a.lookup(relay, "Deployment")
	require.True(t, ok)
	require.Equal(t, writtenChild{uid: "u1", generation: 2, specHash: "h"}, w)
	_, ok = a.lookup(relay, "CronJob")
	require.False(t, ok, "kinds are apart")

	a.forget(relay)
	_, ok = a.lookup(relay, "Deployment")
	require.False(t, ok)
}

func TestSpecHash(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	hash := func(replicas int32, labels map[string]string) string {
		h, err := specHash(labels, RelayDeployment(relay, testImage, "s", replicas).Spec)
		require.NoError(t, err)
		return h
	}
	l := map[string]string{"a": "1"}
	require.Equal(t, hash(1, l), hash(1, map[string]string{"a": "1"}), "deterministic")
	require.NotEqual(t, hash(1, l), hash(2, l), "covers the spec")
	require.NotEqual(t, hash(1, l), hash(1, map[string]string{"a": "2"}), "covers the labels")
	require.Len(t, hash(1, l), 32)
}

// A `kubectl rollout restart` is kept when the operator writes the
// Deployment's spec again; everything else of the spec is replaced.
func TestDeploymentCopySpecKeepsRestart(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	live := RelayDeployment(relay, testImage, "s", 1)
	live.Spec.Template.Annotations[annotationRestartedAt] = "2026-12-01T10:00:00Z"
	live.Spec.Template.Spec.Containers[0].Image = "edited-by-hand"
	desired := RelayDeployment(relay, testImage, "s", 3)

	deploymentKind.copySpec(live, desired)
	require.Equal(t, "2026-12-01T10:00:00Z", live.Spec.Template.Annotations[annotationRestartedAt])
	require.Equal(t, testImage, live.Spec.Template.Spec.Containers[0].Image, "the edit is put back")
	require.Equal(t, int32(3), *live.Spec.Replicas)
	_, restarted := desired.Spec.Template.Annotations[annotationRestartedAt]
	require.False(t, restarted, "desired is left alone")
}
