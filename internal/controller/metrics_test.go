package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// gathered returns the relay gauges of reg by name, for one relay.
func gathered(t *testing.T, reg *prometheus.Registry, key types.NamespacedName) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == key.Namespace && labels["name"] == key.Name {
				got[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

func TestRelayMetricsDeadLetters(t *testing.T) {
	t.Parallel()
	m := NewRelayMetrics()
	m.Now = func() time.Time { return statusNow }
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	key := types.NamespacedName{Namespace: "ns", Name: "orders"}

	m.Set(key, v1alpha1.OutboxRelayStatus{})
	require.NotContains(t, gathered(t, reg, key), "outbox_operator_relay_dead_letters", "nothing counted yet: no series")

	m.Set(key, v1alpha1.OutboxRelayStatus{Backlog: ptr.To[int64](10), DeadLetters: ptr.To[int64](3)})
	got := gathered(t, reg, key)
	require.Equal(t, 3.0, got["outbox_operator_relay_dead_letters"])
	require.Equal(t, 10.0, got["outbox_operator_relay_backlog"], "parked rows are not backlog")

	m.Delete(key)
	require.Empty(t, gathered(t, reg, key), "a deleted relay's series are gone")
}

func TestRelayMetricsConditionsAndStalledAfter(t *testing.T) {
	t.Parallel()
	m := NewRelayMetrics()
	m.Now = func() time.Time { return statusNow }
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	key := types.NamespacedName{Namespace: "ns", Name: "orders"}

	m.Set(key, v1alpha1.OutboxRelayStatus{Conditions: []metav1.Condition{
		{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionTrue, Reason: "RelaysReady"},
		{Type: "StreamIntact", Status: metav1.ConditionFalse, Reason: "StreamReset"},
	}})
	m.SetStalledAfter(key, 5*time.Minute)
	m.Set(key, v1alpha1.OutboxRelayStatus{Conditions: []metav1.Condition{
		{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionTrue, Reason: "RelaysReady"},
		{Type: "StreamIntact", Status: metav1.ConditionFalse, Reason: "StreamReset"},
	}})
	require.Equal(t, 300.0, gathered(t, reg, key)["outbox_operator_relay_stalled_after_seconds"], "kept across Set")

	families, err := reg.Gather()
	require.NoError(t, err)
	var conditions []string
	for _, f := range families {
		if f.GetName() != "outbox_operator_relay_condition" {
			continue
		}
		for _, metric := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range metric.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			require.Equal(t, 1.0, metric.GetGauge().GetValue())
			conditions = append(conditions, l["namespace"]+"/"+l["name"]+" "+l["type"]+"="+l["status"]+" "+l["reason"])
		}
	}
	require.ElementsMatch(t, []string{"ns/orders Ready=True RelaysReady", "ns/orders StreamIntact=False StreamReset"}, conditions)
}
