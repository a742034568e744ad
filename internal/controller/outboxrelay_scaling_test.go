package controller

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// withExternalReplicas puts the relay in replicas.mode External at count.
func withExternalReplicas(count int32) relayOption {
	return func(r *v1alpha1.OutboxRelay) {
		r.Spec.Replicas.Mode = v1alpha1.ReplicasModeExternal
		r.Spec.Replicas.Count = ptr.To(count)
	}
}

// replicasAre is a waitDeployment check of spec.replicas.
func replicasAre(n int32) func(*appsv1.Deployment) error {
	return func(d *appsv1.Deployment) error {
		if got := ptr.Deref(d.Spec.Replicas, -1); got != n {
			return fmt.Errorf("replicas %d, want %d", got, n)
		}
		return nil
	}
}

// readSample reads a file of config/samples/autoscaling into obj.
func readSample(t *testing.T, name string, obj any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "autoscaling", name))
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(raw, obj), name)
}

// testExternalReplicasFollowScaleSubresource: in External mode the
// autoscaler's count (written through the scale subresource, as an HPA or
// KEDA does) is the Deployment's, whatever the backlog; the HPA sample is
// accepted by the API server and targets the relay's scale subresource.
func testExternalReplicasFollowScaleSubresource(t *testing.T, s *suite) {
	ctx := context.Background()
	key, conn := s.readyRelay(t, withReplicas(1, 10, 10, "0s"), withExternalReplicas(1))
	s.deployment(t, key)
	s.markAvailable(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)

	// The HPA sample, pointed at this relay, is accepted and finds its scale subresource.
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	readSample(t, "hpa.yaml", hpa)
	require.Equal(t, v1alpha1.GroupVersion.String(), hpa.Spec.ScaleTargetRef.APIVersion)
	require.Equal(t, "OutboxRelay", hpa.Spec.ScaleTargetRef.Kind)
	hpa.Namespace, hpa.Spec.ScaleTargetRef.Name = key.Namespace, key.Name
	require.NoError(t, s.c.Create(ctx, hpa))
	metric := hpa.Spec.Metrics[0].External.Metric
	requireGauge(t, s, metric.Name, key, 0) // the HPA's metric is the operator's...
	require.Contains(t, metric.Selector.MatchLabels, "name", "...labelled by the relay's name")

	relay := s.relay(t, key)
	scale := &autoscalingv1.Scale{}
	require.NoError(t, s.c.SubResource("scale").Get(ctx, relay, scale))
	require.Equal(t, int32(1), scale.Spec.Replicas)
	require.Equal(t, int32(1), scale.Status.Replicas)
	require.Equal(t, "app.kubernetes.io/component=relay,app.kubernetes.io/instance=orders,app.kubernetes.io/name=outbox-relay",
		scale.Status.Selector, "the HPA finds the relay pods by it")

	// A backlog that asks for more relays changes nothing: the autoscaler decides.
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 'order.created', '{}' FROM generate_series(1, 50)`)
	require.NoError(t, err)
	s.waitStatus(t, key, "the backlog of 50 measured", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, 0) != 50 {
			return fmt.Errorf("backlog %v", st.Backlog)
		}
		return nil
	})
	require.Equal(t, int32(1), ptr.Deref(s.deployment(t, key).Spec.Replicas, -1))

	// The autoscaler scales to 3 through the scale subresource.
	s.setScale(t, key, 3)
	require.Equal(t, ptr.To[int32](3), s.relay(t, key).Spec.Replicas.Count)
	s.waitDeployment(t, key, "3 replicas from the scale subresource", replicasAre(3))
	s.waitStatus(t, key, "desiredReplicas 3", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.DesiredReplicas, -1) != 3 {
			return fmt.Errorf("desiredReplicas %v", st.DesiredReplicas)
		}
		return nil
	})

	// And to 0, as KEDA does on an empty outbox.
	s.setScale(t, key, 0)
	s.waitDeployment(t, key, "0 replicas from the scale subresource", replicasAre(0))
}

// testLogicalReplicationExternalAtZeroRunsOne: a relay of source
// LogicalReplication in External mode, scaled to 0 through the scale
// subresource (KEDA on an empty-looking slot backlog), still runs one relay:
// the slot's backlog misses some pending rows; suspend stops it.
func testLogicalReplicationExternalAtZeroRunsOne(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t, withSource(v1alpha1.SourceLogicalReplication), withExternalReplicas(2))
	s.waitDeployment(t, key, "2 replicas from the count", replicasAre(2))
	s.setScale(t, key, 0)
	relay := s.relay(t, key)
	require.Equal(t, ptr.To[int32](0), relay.Spec.Replicas.Count)
	s.waitStatus(t, key, "the count of 0 observed", func(st *v1alpha1.OutboxRelayStatus) error {
		if st.ObservedGeneration < relay.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", st.ObservedGeneration, relay.Generation)
		}
		return nil
	})
	s.waitDeployment(t, key, "1 replica although the count is 0", replicasAre(1))
	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) { r.Spec.Suspend = true })
	s.waitDeployment(t, key, "0 replicas when suspended", replicasAre(0))
}

// setScale writes the relay's scale subresource as an autoscaler does:
// read it, set spec.replicas, write it back, again on a conflict.
func (s *suite) setScale(t *testing.T, key types.NamespacedName, n int32) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		relay := &v1alpha1.OutboxRelay{}
		if err := s.c.Get(ctx, key, relay); err != nil {
			return err
		}
		scale := &autoscalingv1.Scale{}
		if err := s.c.SubResource("scale").Get(ctx, relay, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = n
		return s.c.SubResource("scale").Update(ctx, relay, client.WithSubResourceBody(scale))
	}))
}

// testKEDASampleTargetsTheScaleSubresource checks the KEDA ScaledObject
// sample without KEDA (its CRD is not installed here): it names the
// OutboxRelay kind and a metric the operator exports.
func testKEDASampleTargetsTheScaleSubresource(t *testing.T, s *suite) {
	var so unstructured.Unstructured
	readSample(t, "keda-scaledobject.yaml", &so.Object)
	require.Equal(t, "ScaledObject", so.GetKind())
	target, _, _ := unstructured.NestedStringMap(so.Object, "spec", "scaleTargetRef")
	require.Equal(t, map[string]string{"apiVersion": v1alpha1.GroupVersion.String(), "kind": "OutboxRelay", "name": "orders"}, target)
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	require.Len(t, triggers, 1)
	query, _, _ := unstructured.NestedString(triggers[0].(map[string]any), "metadata", "query")
	key, _ := s.readyRelay(t)
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	name, _, ok := strings.Cut(strings.TrimPrefix(query, "max("), "{")
	require.True(t, ok, query)
	_, err := gaugeValue(s, name, key)
	require.NoError(t, err, "the query's metric %q is one the operator exports", name)
}

// testReconcilePauseAnnotation: relay.outbox.dev/reconcile=disabled stops
// every write to the children (an edit by hand stays, a spec change waits),
// Ready says so, and removing it applies what waited.
func testReconcilePauseAnnotation(t *testing.T, s *suite) {
	ctx := context.Background()
	key, _ := s.readyRelay(t)
	s.markAvailable(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)

	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) {
		r.Annotations = map[string]string{v1alpha1.AnnotationReconcile: v1alpha1.ReconcileDisabled}
	})
	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonReconcilePaused)
	require.Contains(t, findCondition(got, v1alpha1.ConditionReady).Message, "relay.outbox.dev/reconcile=disabled")

	// An edit by hand, then a spec change that would undo it.
	dep := s.deployment(t, key)
	dep.Spec.Replicas = ptr.To[int32](4)
	require.NoError(t, s.c.Update(ctx, dep))
	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) { r.Spec.Suspend = true })
	gen := s.relay(t, key).Generation
	s.waitStatus(t, key, "the paused relay's status of the new spec", func(st *v1alpha1.OutboxRelayStatus) error {
		if st.ObservedGeneration < gen {
			return fmt.Errorf("observedGeneration %d < %d", st.ObservedGeneration, gen)
		}
		return nil
	})
	require.Equal(t, int32(4), ptr.Deref(s.deployment(t, key).Spec.Replicas, -1), "nothing written while paused")
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonReconcilePaused)

	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) { delete(r.Annotations, v1alpha1.AnnotationReconcile) })
	s.waitDeployment(t, key, "the suspend applied once resumed", replicasAre(0))
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSuspended)
}
