package packaging

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// requireMonitors checks the scrape settings the alerts and the dashboard
// rely on: the manager's ServiceMonitor keeps the per-relay gauges'
// namespace label (honorLabels) and scrapes over HTTPS with a token; the
// relays' PodMonitor names the OutboxRelay in outboxrelay and
// outboxrelay_namespace.
func requireMonitors(t testing.TB, sm, pm *unstructured.Unstructured) {
	t.Helper()
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	ep := endpoints[0].(map[string]any)
	require.Equal(t, true, ep["honorLabels"], "the per-relay gauges' namespace label must not become exported_namespace")
	require.Equal(t, "https", ep["scheme"])
	require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", ep["bearerTokenFile"])

	selector, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	require.Equal(t, map[string]string{
		"app.kubernetes.io/name": "outbox-relay", "app.kubernetes.io/component": "relay",
		"app.kubernetes.io/managed-by": "outbox-operator",
	}, selector, "the labels of the relay pods (internal/controller/labels.go)")
	pods, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	require.Len(t, pods, 1)
	pep := pods[0].(map[string]any)
	require.Equal(t, "metrics", pep["port"])
	targets := map[string]any{}
	for _, r := range pep["relabelings"].([]any) {
		r := r.(map[string]any)
		targets[r["targetLabel"].(string)] = r["sourceLabels"]
	}
	require.Equal(t, map[string]any{
		"outboxrelay":           []any{"__meta_kubernetes_pod_label_app_kubernetes_io_instance"},
		"outboxrelay_namespace": []any{"__meta_kubernetes_namespace"},
	}, targets)
}

// requireMetricsRBAC checks the metrics endpoint's RBAC: the manager may
// create TokenReviews and SubjectAccessReviews (as config/rbac grants), and
// the metrics-reader ClusterRole grants get on /metrics.
func requireMetricsRBAC(t testing.TB, objs []*unstructured.Unstructured, prefix, sa, namespace string) {
	t.Helper()
	auth := find(t, objs, "ClusterRole", prefix+"metrics-auth-role")
	require.Equal(t, []string{"authentication.k8s.io tokenreviews create", "authorization.k8s.io subjectaccessreviews create"},
		ruleGrants(t, rulesOf(t, auth)))
	requireBinding(t, find(t, objs, "ClusterRoleBinding", prefix+"metrics-auth-rolebinding"), "ClusterRole", auth.GetName(), sa, namespace)
	var reader rbacv1.ClusterRole
	readerObj := find(t, objs, "ClusterRole", prefix+"metrics-reader").Object
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(readerObj, &reader))
	require.Equal(t, []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}, reader.Rules)
}

func TestChartMonitoring(t *testing.T) {
	t.Parallel()
	objs, err := helmTemplate(t, "outbox-operator", "outbox-system", []string{"ci/monitoring-values.yaml"})
	require.NoError(t, err)
	requireMonitors(t, find(t, objs, "ServiceMonitor", "outbox-operator"), find(t, objs, "PodMonitor", "outbox-operator-relays"))
	requireMetricsRBAC(t, objs, "outbox-operator-", "outbox-operator", "outbox-system")

	// The certificate from the Secret.
	_, c := manager(t, objs, "outbox-operator")
	require.Equal(t, []string{"--metrics-cert-dir=/var/run/metrics-certs"}, argsWithPrefix(c, "--metrics-cert-dir"))
	require.Len(t, c.VolumeMounts, 1)

	// The alerts, with the runbooks moved.
	rule := find(t, objs, "PrometheusRule", "outbox-operator")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	require.Len(t, groups, 1)
	rules := groups[0].(map[string]any)["rules"].([]any)
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "prometheus", "alerts.yaml"))
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Rules []any `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(data, &file))
	require.Len(t, rules, len(file.Groups[0].Rules), "every alert of config/prometheus/alerts.yaml")
	for _, r := range rules {
		url := r.(map[string]any)["annotations"].(map[string]any)["runbook_url"].(string)
		require.True(t, strings.HasPrefix(url, "https://runbooks.example.com/outbox/operations.md#"), url)
	}

	// The dashboard, where Grafana's sidecar finds it.
	cm := find(t, objs, "ConfigMap", "outbox-operator-dashboard")
	require.Equal(t, "monitoring", cm.GetNamespace())
	require.Equal(t, "1", cm.GetLabels()["grafana_dashboard"])
	dashboard, err := os.ReadFile(filepath.Join(repoRoot, "config", "grafana", "outbox-operator.json"))
	require.NoError(t, err)
	got, _, _ := unstructured.NestedString(cm.Object, "data", "outbox-operator.json")
	require.JSONEq(t, string(dashboard), got)

	// The NetworkPolicies: the manager's, and the relays' in each namespace.
	policies := ofKind(objs, "NetworkPolicy")
	namespaces := make([]string, 0, len(policies))
	for _, o := range policies {
		var np networkingv1.NetworkPolicy
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &np))
		require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)
		namespaces = append(namespaces, np.Namespace)
		var peers []string
		for _, e := range np.Spec.Egress {
			require.NotEmpty(t, e.To, "%s/%s: an egress rule to anywhere", np.Namespace, np.Name)
			for _, p := range e.Ports {
				peers = append(peers, p.Port.String())
			}
		}
		require.Subset(t, peers, []string{"53", "5432", "6379", "26379"}, "%s/%s", np.Namespace, np.Name)
		require.Equal(t, "metrics", np.Spec.Ingress[0].Ports[0].Port.String())
		require.NotEmpty(t, np.Spec.Ingress[0].From, "metrics only from metricsFrom")
		if np.Namespace == "outbox-system" {
			require.Equal(t, "outbox-operator", np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"])
			require.Contains(t, peers, "443", "the API server")
		} else {
			require.Equal(t, "outbox-relay", np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"])
		}
	}
	require.ElementsMatch(t, []string{"outbox-system", "shop", "billing"}, namespaces)

	// Off by default.
	objs, err = helmTemplate(t, "outbox-operator", "outbox-system", nil)
	require.NoError(t, err)
	for _, kind := range []string{"PodMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy", "ServiceMonitor"} {
		require.Empty(t, ofKind(objs, kind), kind)
	}
}
