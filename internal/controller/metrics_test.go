package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// What a scrape reads: every series of each relay.
func TestRelayMetricsExposition(t *testing.T) {
	t.Parallel()
	m := NewRelayMetrics()
	m.Now = func() time.Time { return statusNow }
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	oldest := metav1.NewTime(statusNow.Add(-90 * time.Second))
	checked := metav1.NewTime(time.Unix(1_800_000_000, 0))
	for _, key := range []types.NamespacedName{{Namespace: "ns", Name: "orders"}, {Namespace: "other", Name: "audit"}} {
		m.Set(key, v1alpha1.OutboxRelayStatus{
			Backlog: ptr.To[int64](12), OldestPendingTime: &oldest, DeadLetters: ptr.To[int64](0),
			LastBacklogCheckTime: &checked, DesiredReplicas: ptr.To[int32](2), ReadyReplicas: 1,
			Conditions: []metav1.Condition{
				{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse, Reason: "RelaysProgressing"},
				{Type: "DatabaseReachable", Status: metav1.ConditionTrue, Reason: "BacklogMeasured"},
			},
		})
		m.SetStalledAfter(key, 5*time.Minute)
	}
	m.Set(types.NamespacedName{Namespace: "ns", Name: "new"}, v1alpha1.OutboxRelayStatus{})

	series := func(name, help string, values ...string) string {
		return "# HELP outbox_operator_relay_" + name + " " + help + "\n# TYPE outbox_operator_relay_" + name + " gauge\n" +
			strings.Join(values, "\n") + "\n"
	}
	relays := func(name, orders, audit, fresh string) []string {
		out := []string{}
		for _, r := range []struct{ ns, name, v string }{{"ns", "new", fresh}, {"ns", "orders", orders}, {"other", "audit", audit}} {
			if r.v != "" {
				out = append(out, "outbox_operator_relay_"+name+`{name="`+r.name+`",namespace="`+r.ns+`"} `+r.v)
			}
		}
		return out
	}
	want := series("backlog", "Undispatched rows of the outbox table at the last backlog check.", relays("backlog", "12", "12", "")...) +
		series("condition",
			"1 for each condition of the OutboxRelay's status, labelled with its type, status (True, False, Unknown) and reason.",
			`outbox_operator_relay_condition{name="audit",namespace="other",reason="BacklogMeasured",status="True",type="DatabaseReachable"} 1`,
			`outbox_operator_relay_condition{name="audit",namespace="other",reason="RelaysProgressing",status="False",type="Ready"} 1`,
			`outbox_operator_relay_condition{name="orders",namespace="ns",reason="BacklogMeasured",status="True",type="DatabaseReachable"} 1`,
			`outbox_operator_relay_condition{name="orders",namespace="ns",reason="RelaysProgressing",status="False",type="Ready"} 1`) +
		series("dead_letters", "Rows parked in the dead-letter table at the last backlog check; not part of the backlog.",
			relays("dead_letters", "0", "0", "")...) +
		series("desired_replicas", "Relays the operator asks the Deployment for.", relays("desired_replicas", "2", "2", "0")...) +
		series("last_backlog_check_timestamp_seconds", "Unix time of the last successful backlog check.",
			relays("last_backlog_check_timestamp_seconds", "1.8e+09", "1.8e+09", "")...) +
		series("oldest_pending_age_seconds", "Age of the oldest undispatched row, 0 when none is pending.",
			relays("oldest_pending_age_seconds", "90", "90", "")...) +
		series("ready", "1 when the OutboxRelay's Ready condition is True, else 0.", relays("ready", "0", "0", "0")...) +
		series("ready_replicas", "Ready relay pods.", relays("ready_replicas", "1", "1", "0")...) +
		series("stalled_after_seconds",
			"spec.backlog.stalledAfter: the age of the oldest pending row past which the backlog counts as stalled.",
			relays("stalled_after_seconds", "300", "300", "")...)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}

// A scrape of a thousand relays' series, as Prometheus makes it.
//
//	go test -run '^$' -bench RelayMetricsGather -benchmem ./internal/controller/
func BenchmarkRelayMetricsGather(b *testing.B) {
	m := NewRelayMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(b, reg.Register(m))
	oldest := metav1.NewTime(statusNow.Add(-time.Minute))
	for i := range 1000 {
		key := types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("relay-%04d", i)}
		m.Set(key, v1alpha1.OutboxRelayStatus{
			Backlog: ptr.To[int64](3), OldestPendingTime: &oldest, DeadLetters: ptr.To[int64](0), LastBacklogCheckTime: &oldest,
			DesiredReplicas: ptr.To[int32](1), ReadyReplicas: 1, Conditions: []metav1.Condition{
				{Type: "SecretsResolved", Status: metav1.ConditionTrue, Reason: "SecretsResolved"},
				{Type: "DatabaseReachable", Status: metav1.ConditionTrue, Reason: "BacklogMeasured"},
				{Type: "BacklogHealthy", Status: metav1.ConditionTrue, Reason: "BacklogWithinLimit"},
				{Type: "RelaysAvailable", Status: metav1.ConditionTrue, Reason: "RelaysAvailable"},
				{Type: "DeadLettersClear", Status: metav1.ConditionTrue, Reason: "NoDeadLetters"},
				{Type: "StreamIntact", Status: metav1.ConditionTrue, Reason: "NoStreamReset"},
				{Type: "Ready", Status: metav1.ConditionTrue, Reason: "RelaysReady"},
			},
		})
		m.SetStalledAfter(key, 5*time.Minute)
	}
	b.ReportAllocs()
	for range b.N {
		_, err := reg.Gather()
		require.NoError(b, err)
	}
}
