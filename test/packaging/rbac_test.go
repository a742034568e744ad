package packaging

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// rbacMarker starts a controller-gen RBAC marker comment.
const rbacMarker = "+kubebuilder:rbac:"

// markerGrants reads every +kubebuilder:rbac marker in the module's non-test
// Go files, as controller-gen does for `make manifests` (paths="./..."), and
// returns what they grant, one "group resource verb" string each.
func markerGrants(t testing.TB) []string {
	t.Helper()
	var grants []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "dist", "testdata", "vendor", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(data)) {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "//") {
				continue
			}
			body, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(line, "//")), rbacMarker)
			if !ok {
				continue
			}
			grants = append(grants, parseRBACMarker(t, path, body)...)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, grants, "found no %s markers", rbacMarker)
	slices.Sort(grants)
	return slices.Compact(grants)
}

// parseRBACMarker expands one marker's arguments (groups=apps,resources=deployments,verbs=get;list)
// into grants. Arguments the chart does not handle fail the test.
func parseRBACMarker(t testing.TB, path, body string) []string {
	t.Helper()
	args := map[string][]string{}
	for _, kv := range strings.Split(body, ",") {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "%s: cannot read RBAC marker argument %q", path, kv)
		vals := strings.Split(v, ";")
		for i, s := range vals {
			vals[i] = strings.Trim(s, `"`)
		}
		args[k] = vals
	}
	for k := range args {
		require.Contains(t, []string{"groups", "resources", "verbs"}, k,
			"%s: RBAC marker argument %q (a namespaced Role, resourceNames or urls) needs support in "+
				"the chart (charts/outbox-operator/templates/rbac.yaml, Makefile helm-sync) and in this test", path, k)
	}
	grants := make([]string, 0, len(args["groups"])*len(args["resources"])*len(args["verbs"]))
	for _, g := range args["groups"] {
		for _, r := range args["resources"] {
			for _, v := range args["verbs"] {
				grants = append(grants, g+" "+r+" "+v)
			}
		}
	}
	return grants
}

// ruleGrants expands policy rules into "group resource verb" strings.
func ruleGrants(t testing.TB, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var grants []string
	for _, r := range rules {
		require.Empty(t, r.ResourceNames, "resourceNames are not expected: %+v", r)
		require.Empty(t, r.NonResourceURLs, "nonResourceURLs are not expected: %+v", r)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					grants = append(grants, g+" "+res+" "+v)
				}
			}
		}
	}
	slices.Sort(grants)
	return slices.Compact(grants)
}

// rulesOf converts a rendered ClusterRole or Role.
func rulesOf(t testing.TB, o *unstructured.Unstructured) []rbacv1.PolicyRule {
	t.Helper()
	var role rbacv1.ClusterRole // Role has the same rules
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
	return role.Rules
}

// generatedRole reads config/rbac/role.yaml.
func generatedRole(t testing.TB) *rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
	require.NoError(t, err)
	var role rbacv1.ClusterRole
	require.NoError(t, yaml.UnmarshalStrict(data, &role))
	return &role
}

func TestGeneratedRoleMatchesMarkers(t *testing.T) {
	t.Parallel()
	role := generatedRole(t)
	require.Equal(t, "manager-role", role.Name)
	require.Equal(t, markerGrants(t), ruleGrants(t, role.Rules),
		"config/rbac/role.yaml is stale: run `make manifests`")
}

// The chart turns the manager's rules into Roles when watchNamespaces is
// set, and config/default binds them with RoleBindings in the watched
// namespaces only; that is complete only while every resource they name is
// namespaced.
func TestManagerRulesAreNamespaced(t *testing.T) {
	t.Parallel()
	cluster(t)
	mapper := apiServer.c.RESTMapper()
	for _, g := range markerGrants(t) {
		parts := strings.Split(g, " ") // the core group is ""
		group, resource := parts[0], strings.SplitN(parts[1], "/", 2)[0]
		gvk, err := mapper.KindFor(schema.GroupVersionResource{Group: group, Resource: resource})
		require.NoError(t, err, "resource %s of group %q", resource, group)
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err)
		require.Equal(t, meta.RESTScopeNameNamespace, m.Scope.Name(),
			"%s is cluster-scoped: with watchNamespaces the chart grants only Roles, and config/default "+
				"only RoleBindings; give charts/outbox-operator/templates/rbac.yaml a ClusterRole for it, "+
				"and config/default a ClusterRoleBinding", gvk)
	}
}

func TestChartRBACMatchesMarkers(t *testing.T) {
	t.Parallel()
	want := markerGrants(t)

	t.Run("AllNamespaces", func(t *testing.T) {
		t.Parallel()
		objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil)
		require.NoError(t, err)
		role := find(t, objs, "ClusterRole", "outbox-operator-manager-role")
		require.Equal(t, want, ruleGrants(t, rulesOf(t, role)))
		requireBinding(t, find(t, objs, "ClusterRoleBinding", "outbox-operator-manager-rolebinding"),
			"ClusterRole", role.GetName(), "outbox-operator", "outbox-system")
		require.Empty(t, managerRoles(objs, "Role"), "no namespaced manager Role without watchNamespaces")
		requireLeaderElectionRole(t, objs, "outbox-operator", "outbox-system")
	})

	t.Run("WatchNamespaces", func(t *testing.T) {
		t.Parallel()
		objs, err := helmTemplate(t, "ops", "platform", []string{"ci/namespaced-values.yaml"})
		require.NoError(t, err)
		roles := managerRoles(objs, "Role")
		namespaces := make([]string, 0, len(roles))
		for _, role := range roles {
			namespaces = append(namespaces, role.GetNamespace())
			require.Equal(t, want, ruleGrants(t, rulesOf(t, role)), "Role in %s", role.GetNamespace())
		}
		require.ElementsMatch(t, []string{"team-a", "team-b"}, namespaces)
		bindings := ofKind(objs, "RoleBinding")
		for _, ns := range namespaces {
			var b *unstructured.Unstructured
			for _, o := range bindings {
				if o.GetNamespace() == ns {
					b = o
				}
			}
			require.NotNil(t, b, "RoleBinding in %s", ns)
			requireBinding(t, b, "Role", "outbox-relays-operator-manager-role", "outbox-operator-sa", "platform")
		}
		// Nothing cluster-wide but the CRD (aggregateToDefaultRoles is off
		// there) and the metrics endpoint's authentication and authorization
		// (TokenReviews and SubjectAccessReviews are cluster-scoped).
		for _, o := range objs {
			if o.GetNamespace() == "" && o.GetKind() != "CustomResourceDefinition" {
				require.Contains(t, []string{"outbox-relays-operator-metrics-auth-role", "outbox-relays-operator-metrics-auth-rolebinding",
					"outbox-relays-operator-metrics-reader"}, o.GetName(), "cluster-scoped %s %s", o.GetKind(), o.GetName())
			}
		}
		requireLeaderElectionRole(t, objs, "outbox-operator-sa", "platform")
	})
}

// managerRoles returns the manager's Roles or ClusterRoles (not the leader
// election Role, nor the editor and viewer ClusterRoles).
func managerRoles(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range ofKind(objs, kind) {
		if strings.HasSuffix(o.GetName(), "-manager-role") {
			out = append(out, o)
		}
	}
	return out
}

// requireBinding checks that b binds role to the ServiceAccount.
func requireBinding(t testing.TB, b *unstructured.Unstructured, roleKind, role, sa, saNamespace string) {
	t.Helper()
	var rb rbacv1.RoleBinding // ClusterRoleBinding has the same fields
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(b.Object, &rb))
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: roleKind, Name: role}, rb.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: saNamespace}}, rb.Subjects)
}

// leaderElectionGrants is what leader election needs in the manager's
// namespace: its Lease, and the Events that record the leader.
var leaderElectionGrants = []string{
	" events create", " events patch",
	"coordination.k8s.io leases create", "coordination.k8s.io leases delete", "coordination.k8s.io leases get",
	"coordination.k8s.io leases list", "coordination.k8s.io leases patch", "coordination.k8s.io leases update",
	"coordination.k8s.io leases watch",
	"events.k8s.io events create", "events.k8s.io events patch",
}

// requireLeaderElectionRole checks the leader election Role and its binding
// in the manager's namespace.
func requireLeaderElectionRole(t testing.TB, objs []*unstructured.Unstructured, sa, namespace string) {
	t.Helper()
	var role, binding *unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-leader-election-role"):
			role = o
		case o.GetKind() == "RoleBinding" && strings.HasSuffix(o.GetName(), "-leader-election-rolebinding"):
			binding = o
		}
	}
	require.NotNil(t, role, "leader election Role")
	require.NotNil(t, binding, "leader election RoleBinding")
	require.Equal(t, namespace, role.GetNamespace())
	require.Equal(t, namespace, binding.GetNamespace())
	require.Equal(t, leaderElectionGrants, ruleGrants(t, rulesOf(t, role)))
	requireBinding(t, binding, "Role", role.GetName(), sa, namespace)
}

// The user roles let people manage OutboxRelays; they never reach the manager.
func TestChartUserRolesAggregate(t *testing.T) {
	t.Parallel()
	objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil)
	require.NoError(t, err)
	editor := find(t, objs, "ClusterRole", "outbox-operator-outboxrelay-editor-role")
	viewer := find(t, objs, "ClusterRole", "outbox-operator-outboxrelay-viewer-role")
	require.Equal(t, "true", editor.GetLabels()["rbac.authorization.k8s.io/aggregate-to-edit"])
	require.Equal(t, "true", editor.GetLabels()["rbac.authorization.k8s.io/aggregate-to-admin"])
	require.Equal(t, "true", viewer.GetLabels()["rbac.authorization.k8s.io/aggregate-to-view"])
	for _, g := range ruleGrants(t, rulesOf(t, viewer)) {
		require.Regexp(t, ` (get|list|watch)$`, g, "the viewer role only reads")
	}
	for _, b := range append(ofKind(objs, "ClusterRoleBinding"), ofKind(objs, "RoleBinding")...) {
		ref, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		require.NotContains(t, []string{editor.GetName(), viewer.GetName()}, ref, "%s binds a user role", b.GetName())
	}

	// The same rules as kubebuilder's editor and viewer roles in config/rbac.
	for name, role := range map[string]*unstructured.Unstructured{"editor": editor, "viewer": viewer} {
		data, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "outboxrelay_"+name+"_role.yaml"))
		require.NoError(t, err)
		var kustomized rbacv1.ClusterRole
		require.NoError(t, yaml.UnmarshalStrict(data, &kustomized))
		require.Equal(t, ruleGrants(t, kustomized.Rules), ruleGrants(t, rulesOf(t, role)), name)
	}

	objs, err = helmTemplate(t, "outbox-operator", "outbox-system", nil, "rbac.aggregateToDefaultRoles=false")
	require.NoError(t, err)
	require.Len(t, ofKind(objs, "ClusterRole"), 3, "only the manager's ClusterRole and the metrics endpoint's two")
}
