package packaging

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// kustomizeBuild renders a kustomization directory of the repository.
func kustomizeBuild(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := run(context.Background(), nil, tool(t, "kustomize"), "build", dir)
	require.NoError(t, err)
	objs, err := decodeYAML(out)
	require.NoError(t, err)
	return objs
}

// printInstaller runs `make print-installer`: what `make build-installer`
// writes to dist/install.yaml, for the image img, without regenerating.
func printInstaller(t testing.TB, img string) []*unstructured.Unstructured {
	t.Helper()
	tool(t, "kustomize") // make would build it, and print that on stdout
	mk, err := exec.LookPath("make")
	if err != nil {
		missing(t, "make is missing: apt-get install -y make")
	}
	// Not the jobserver of a make that runs this test.
	env := []string{"MAKEFLAGS=", "MFLAGS=", "MAKELEVEL="}
	out, err := run(context.Background(), env, mk, "-s", "--no-print-directory", "print-installer",
		"IMG="+img, "DIST="+t.TempDir())
	require.NoError(t, err)
	objs, err := decodeYAML(out)
	require.NoError(t, err)
	return objs
}

// The installer (config/default, dist/install.yaml) passes the API server's
// validation.
func TestInstallerAppliesToAPIServer(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, "config/default")
	ns := find(t, objs, "Namespace", "outbox-operator-system")
	require.Equal(t, "restricted", ns.GetLabels()["pod-security.kubernetes.io/enforce"])
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding":
		default:
			require.Equal(t, "outbox-operator-system", o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
		}
	}
	dryRunApply(t, objs)
}

// The installer's manager: its image is also its default relay image, its
// RBAC is the generated role bound to its ServiceAccount, leader election
// is on, and the metrics Service selects it.
func TestInstallerManager(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, "config/default")
	d, c := manager(t, objs, "outbox-operator-controller-manager")
	require.Equal(t, "ghcr.io/outbox-dev/outbox-operator:dev", c.Image)
	require.Equal(t, c.Image, env(c, "OPERATOR_IMAGE"))
	require.Equal(t, []string{"--leader-elect"}, argsWithPrefix(c, "--leader-elect"))
	require.Equal(t, "outbox-operator-controller-manager", d.Spec.Template.Spec.ServiceAccountName)
	find(t, objs, "ServiceAccount", "outbox-operator-controller-manager")

	role := find(t, objs, "ClusterRole", "outbox-operator-manager-role")
	require.Equal(t, markerGrants(t), ruleGrants(t, rulesOf(t, role)))
	requireBinding(t, find(t, objs, "ClusterRoleBinding", "outbox-operator-manager-rolebinding"),
		"ClusterRole", role.GetName(), "outbox-operator-controller-manager", "outbox-operator-system")
	requireLeaderElectionRole(t, objs, "outbox-operator-controller-manager", "outbox-operator-system")

	svc := find(t, objs, "Service", "outbox-operator-controller-manager-metrics-service")
	selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	require.Equal(t, d.Spec.Selector.MatchLabels, selector)
	require.Equal(t, []string{"--metrics-bind-address=:8443"}, argsWithPrefix(c, "--metrics-bind-address"))
	requireMetricsRBAC(t, objs, "outbox-operator-", "outbox-operator-controller-manager", "outbox-operator-system")
}

// `make build-installer IMG=...` sets the manager's image, and with it the
// default relay image, without editing config/.
func TestInstallerImageOverride(t *testing.T) {
	t.Parallel()
	before, err := os.ReadFile("../../config/manager/kustomization.yaml")
	require.NoError(t, err)

	const img = "registry.example.com/outbox/operator:v9.8.7"
	objs := printInstaller(t, img)
	_, c := manager(t, objs, "outbox-operator-controller-manager")
	require.Equal(t, img, c.Image)
	require.Equal(t, img, env(c, "OPERATOR_IMAGE"))

	after, err := os.ReadFile("../../config/manager/kustomization.yaml")
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "config/manager/kustomization.yaml was edited")
}

// config/prometheus, which config/default leaves out unless uncommented, is a
// valid ServiceMonitor for the installer's metrics Service, a PodMonitor for
// the relays and the alerts' PrometheusRule.
func TestInstallerServiceMonitor(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, "config/prometheus")
	sm := find(t, objs, "ServiceMonitor", "controller-manager-metrics-monitor")
	find(t, objs, "PodMonitor", "relays")
	find(t, objs, "PrometheusRule", "alerts")
	for _, o := range objs {
		o.SetNamespace("outbox-operator-system")
	}
	dryRunApply(t, objs)
	requireMonitors(t, sm, find(t, objs, "PodMonitor", "relays"))

	svcs := kustomizeBuild(t, "config/default")
	svc := find(t, svcs, "Service", "outbox-operator-controller-manager-metrics-service")
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for k, v := range selector {
		require.Equal(t, v, svc.GetLabels()[k], "Service label %s", k)
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	require.Equal(t, ports[0].(map[string]any)["name"], endpoints[0].(map[string]any)["port"])
}
