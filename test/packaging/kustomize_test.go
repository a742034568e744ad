package packaging

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// installers are the kustomizations a user applies (`make deploy`, `make
// build-installer`): the namespaced default and the cluster-wide choice.
var installers = []struct{ name, dir, scope string }{
	{"Namespaced", "config/default", "namespaced"},
	{"ClusterWide", "config/cluster-wide", "cluster"},
}

// The names config/base gives the manager's objects.
const (
	installNamespace = "outbox-operator-system"
	managerSA        = "outbox-operator-controller-manager"
	managerRole      = "outbox-operator-manager-role"
)

// kustomizeBuild renders a kustomization directory (relative to the
// repository, or absolute).
func kustomizeBuild(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := run(context.Background(), nil, tool(t, "kustomize"), "build", dir)
	require.NoError(t, err)
	objs, err := decodeYAML(out)
	require.NoError(t, err)
	return objs
}

// makePrintInstaller runs `make print-installer` with the variables vars:
// what `make build-installer` writes to dist/install.yaml, without
// regenerating.
func makePrintInstaller(t testing.TB, vars ...string) ([]byte, error) {
	t.Helper()
	tool(t, "kustomize") // make would build it, and print that on stdout
	mk, err := exec.LookPath("make")
	if err != nil {
		testenv.Missing(t, "make is missing: apt-get install -y make")
	}
	// Not the jobserver of a make that runs this test.
	env := []string{"MAKEFLAGS=", "MFLAGS=", "MAKELEVEL="}
	args := append([]string{"-s", "--no-print-directory", "print-installer", "DIST=" + t.TempDir()}, vars...)
	return run(context.Background(), env, mk, args...)
}

// printInstaller is makePrintInstaller for the image img, decoded.
func printInstaller(t testing.TB, img string, vars ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := makePrintInstaller(t, append([]string{"IMG=" + img}, vars...)...)
	require.NoError(t, err)
	objs, err := decodeYAML(out)
	require.NoError(t, err)
	return objs
}

// isManagerBinding says whether o is a RoleBinding or ClusterRoleBinding of
// the manager's ClusterRole.
func isManagerBinding(o *unstructured.Unstructured) bool {
	if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
		return false
	}
	kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
	name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
	return kind == "ClusterRole" && name == managerRole
}

// managerBindings returns the bindings of kind (RoleBinding or
// ClusterRoleBinding) of the manager's ClusterRole.
func managerBindings(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range ofKind(objs, kind) {
		if isManagerBinding(o) {
			out = append(out, o)
		}
	}
	return out
}

// bindsManager says whether the binding o has the manager's ServiceAccount
// among its subjects.
func bindsManager(t testing.TB, o *unstructured.Unstructured) bool {
	t.Helper()
	var rb rbacv1.RoleBinding // ClusterRoleBinding has the same fields
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rb))
	for _, s := range rb.Subjects {
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == managerSA && s.Namespace == installNamespace {
			return true
		}
	}
	return false
}

// requireNamespacedRBAC checks a namespaced install that watches namespaces:
// the manager's ClusterRole is bound by a RoleBinding in each of them and
// nowhere else, and no ClusterRoleBinding gives the manager more than the
// metrics endpoint's reviews.
func requireNamespacedRBAC(t testing.TB, objs []*unstructured.Unstructured, namespaces []string) {
	t.Helper()
	require.Empty(t, managerBindings(objs, "ClusterRoleBinding"), "no ClusterRoleBinding of %s", managerRole)
	for _, b := range ofKind(objs, "ClusterRoleBinding") {
		if bindsManager(t, b) {
			require.Equal(t, "outbox-operator-metrics-auth-rolebinding", b.GetName(),
				"the manager's only ClusterRoleBinding is the metrics endpoint's TokenReviews and SubjectAccessReviews")
		}
	}

	bound := make([]string, 0, len(namespaces))
	for _, b := range managerBindings(objs, "RoleBinding") {
		bound = append(bound, b.GetNamespace())
		requireBinding(t, b, "ClusterRole", managerRole, managerSA, installNamespace)
	}
	require.ElementsMatch(t, namespaces, bound, "namespaces of the RoleBindings of %s", managerRole)
	for _, b := range ofKind(objs, "RoleBinding") {
		if bindsManager(t, b) && !isManagerBinding(b) {
			require.Equal(t, "outbox-operator-leader-election-rolebinding", b.GetName(), "RoleBinding %s/%s", b.GetNamespace(), b.GetName())
		}
	}
	requireLeaderElectionRole(t, objs, managerSA, installNamespace)

	_, c := manager(t, objs, managerSA)
	require.Equal(t, []string{"--watch-namespaces=" + strings.Join(namespaces, ",")}, argsWithPrefix(c, "--watch-namespaces"),
		"the manager watches exactly the namespaces where it is bound")
}

// Each installer passes the API server's validation, and puts everything in
// the operator's namespace but config/default's RoleBindings.
func TestInstallerAppliesToAPIServer(t *testing.T) {
	t.Parallel()
	for _, inst := range installers {
		t.Run(inst.name, func(t *testing.T) {
			t.Parallel()
			objs := kustomizeBuild(t, inst.dir)
			ns := find(t, objs, "Namespace", installNamespace)
			require.Equal(t, "restricted", ns.GetLabels()["pod-security.kubernetes.io/enforce"])
			for _, o := range objs {
				switch {
				case o.GetKind() == "Namespace", o.GetKind() == "CustomResourceDefinition",
					o.GetKind() == "ClusterRole", o.GetKind() == "ClusterRoleBinding":
				case o.GetKind() == "RoleBinding" && isManagerBinding(o):
					// In a watched namespace: TestInstallerNamespaced.
				default:
					require.Equal(t, installNamespace, o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
				}
			}
			dryRunApply(t, objs)
		})
	}
}

// Each installer's manager: its image is also its default relay image, its
// ClusterRole is what the markers ask, leader election is on, and the
// metrics Service selects it.
func TestInstallerManager(t *testing.T) {
	t.Parallel()
	for _, inst := range installers {
		t.Run(inst.name, func(t *testing.T) {
			t.Parallel()
			objs := kustomizeBuild(t, inst.dir)
			d, c := manager(t, objs, managerSA)
			require.Equal(t, "ghcr.io/outbox-dev/outbox-operator:dev", c.Image)
			require.Equal(t, c.Image, env(c, "OPERATOR_IMAGE"))
			require.Equal(t, memoryLimitFromContainer, envFrom(c, "CONTAINER_MEMORY_LIMIT"))
			require.Equal(t, []string{"--leader-elect"}, argsWithPrefix(c, "--leader-elect"))
			require.Equal(t, managerSA, d.Spec.Template.Spec.ServiceAccountName)
			find(t, objs, "ServiceAccount", managerSA)

			role := find(t, objs, "ClusterRole", managerRole)
			require.Equal(t, markerGrants(t), ruleGrants(t, rulesOf(t, role)))
			requireLeaderElectionRole(t, objs, managerSA, installNamespace)

			svc := find(t, objs, "Service", "outbox-operator-controller-manager-metrics-service")
			selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
			require.Equal(t, d.Spec.Selector.MatchLabels, selector)
			require.Equal(t, []string{"--metrics-bind-address=:8443"}, argsWithPrefix(c, "--metrics-bind-address"))
			requireMetricsRBAC(t, objs, "outbox-operator-", managerSA, installNamespace)
		})
	}
}

// config/default is namespaced: the manager watches the namespace `default`
// (config/default/watch_namespaces.yaml) and may act there only.
func TestInstallerNamespaced(t *testing.T) {
	t.Parallel()
	requireNamespacedRBAC(t, kustomizeBuild(t, "config/default"), []string{"default"})
}

// config/cluster-wide binds the manager's ClusterRole in every namespace, and
// the manager watches every namespace.
func TestInstallerClusterWide(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, "config/cluster-wide")
	requireBinding(t, find(t, objs, "ClusterRoleBinding", "outbox-operator-manager-rolebinding"),
		"ClusterRole", managerRole, managerSA, installNamespace)
	require.Len(t, managerBindings(objs, "ClusterRoleBinding"), 1)
	require.Empty(t, managerBindings(objs, "RoleBinding"))
	_, c := manager(t, objs, managerSA)
	require.Empty(t, argsWithPrefix(c, "--watch-namespaces"))
}

// What docs/install.md and watch_namespaces.yaml say to do to watch two
// namespaces (the list, and a RoleBinding per namespace) gives the manager
// both, and nothing more.
func TestInstallerWatchNamespacesEdited(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "config")
	for _, dir := range []string{"base", "crd", "rbac", "manager", "default"} {
		require.NoError(t, os.CopyFS(filepath.Join(config, dir), os.DirFS(filepath.Join(repoRoot, "config", dir))))
	}
	path := filepath.Join(config, "default", "watch_namespaces.yaml")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	file := string(data)

	const list = "\n  namespaces: default\n"
	require.Equal(t, 1, strings.Count(file, list), "watch_namespaces.yaml lists the namespace default")
	file = strings.Replace(file, list, "\n  namespaces: team-a,team-b\n", 1)
	docs := strings.Split(file, "\n---\n")
	binding := docs[len(docs)-1]
	const ns = "\n  namespace: default\n"
	require.Contains(t, binding, "kind: RoleBinding")
	require.Equal(t, 1, strings.Count(binding, ns), "the RoleBinding is in the namespace default")
	file += "\n---\n" + strings.Replace(binding, ns, "\n  namespace: team-b\n", 1)
	file = strings.Replace(file, ns, "\n  namespace: team-a\n", 1)
	require.NoError(t, os.WriteFile(path, []byte(file), 0o644))

	objs := kustomizeBuild(t, filepath.Join(config, "default"))
	requireNamespacedRBAC(t, objs, []string{"team-a", "team-b"})
	dryRunApply(t, objs)
}

// `make build-installer IMG=...` sets the manager's image, and with it the
// default relay image, without editing config/; INSTALL_SCOPE picks the
// installer, namespaced unless it says cluster.
func TestInstallerImageOverride(t *testing.T) {
	t.Parallel()
	before, err := os.ReadFile("../../config/manager/kustomization.yaml")
	require.NoError(t, err)

	const img = "registry.example.com/outbox/operator:v9.8.7"
	for _, tc := range []struct {
		name            string
		vars            []string
		watches         []string // the manager's --watch-namespaces
		clusterBindings int      // ClusterRoleBindings of the manager's ClusterRole
	}{
		{"Default", nil, []string{"--watch-namespaces=default"}, 0},
		{"Namespaced", []string{"INSTALL_SCOPE=namespaced"}, []string{"--watch-namespaces=default"}, 0},
		{"Cluster", []string{"INSTALL_SCOPE=cluster"}, nil, 1},
	} {
		objs := printInstaller(t, img, tc.vars...)
		_, c := manager(t, objs, managerSA)
		require.Equal(t, img, c.Image, tc.name)
		require.Equal(t, img, env(c, "OPERATOR_IMAGE"), tc.name)
		require.Equal(t, tc.watches, argsWithPrefix(c, "--watch-namespaces"), tc.name)
		require.Len(t, managerBindings(objs, "ClusterRoleBinding"), tc.clusterBindings, tc.name)
	}

	_, err = makePrintInstaller(t, "INSTALL_SCOPE=all")
	require.ErrorContains(t, err, "INSTALL_SCOPE=all: must be namespaced")

	after, err := os.ReadFile("../../config/manager/kustomization.yaml")
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "config/manager/kustomization.yaml was edited")
}

// config/prometheus, which config/base leaves out unless uncommented, is a
// valid ServiceMonitor for the installer's metrics Service, a PodMonitor for
// the relays and the alerts' PrometheusRule.
func TestInstallerServiceMonitor(t *testing.T) {
	t.Parallel()
	objs := kustomizeBuild(t, "config/prometheus")
	sm := find(t, objs, "ServiceMonitor", "controller-manager-metrics-monitor")
	find(t, objs, "PodMonitor", "relays")
	find(t, objs, "PrometheusRule", "alerts")
	for _, o := range objs {
		o.SetNamespace(installNamespace)
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
