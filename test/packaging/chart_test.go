package packaging

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// ciValues are the chart's non-default values files (ci/*-values.yaml), the
// ones `make helm-lint` lints with.
func ciValues(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for i, f := range files {
		files[i] = filepath.Join("ci", filepath.Base(f))
	}
	return files
}

func TestHelmLint(t *testing.T) {
	t.Parallel()
	for _, values := range append([]string{""}, ciValues(t)...) {
		t.Run(cmpOr(values, "default"), func(t *testing.T) {
			t.Parallel()
			args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
			if values != "" {
				args = append(args, "--values", filepath.Join(chartDir, values))
			}
			out, err := run(context.Background(), helmEnv(t), tool(t, "helm"), args...)
			require.NoError(t, err, "%s", out)
		})
	}
}

// cmpOr is cmp.Or for subtest names.
func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return strings.TrimSuffix(filepath.Base(s), ".yaml")
}

// Every object the chart renders, with default and with non-default values,
// passes the API server's validation (a server-side apply dry run).
func TestChartAppliesToAPIServer(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, release, namespace string
		values                   []string
		set                      []string
		kinds                    []string
	}{{
		name: "Defaults", release: "outbox-operator", namespace: "outbox-system",
		kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole",
			"ClusterRoleBinding", "ClusterRoleBinding", "CustomResourceDefinition",
			"Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"},
	}, {
		name: "WatchNamespaces", release: "ops", namespace: "platform", values: []string{"ci/namespaced-values.yaml"},
		kinds: []string{"ClusterRole", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "Role", "Role", "Role",
			"RoleBinding", "RoleBinding", "RoleBinding", "Service", "ServiceAccount"},
	}, {
		name: "ServiceMonitor", release: "monitored", namespace: "monitoring-test", values: []string{"ci/servicemonitor-values.yaml"},
		kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole",
			"ClusterRoleBinding", "ClusterRoleBinding", "CustomResourceDefinition",
			"Deployment", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"},
	}, {
		name: "Monitoring", release: "outbox-operator", namespace: "outbox-system", values: []string{"ci/monitoring-values.yaml"},
		kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole",
			"ClusterRoleBinding", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition",
			"Deployment", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "PodMonitor", "PrometheusRule",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"},
	}, {
		name: "MetricsInsecure", release: "plain", namespace: "plain-system",
		set: []string{"metrics.secure=false", "metrics.serviceMonitor.enabled=true", "rbac.aggregateToDefaultRoles=false"},
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"},
	}, {
		name: "Minimal", release: "bare", namespace: "bare-system",
		set: []string{
			"crds.install=false", "rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=existing",
			"metrics.enabled=false", "leaderElection.enabled=false", "resources=null",
			"image.digest=sha256:" + strings.Repeat("ab", 32),
		},
		kinds: []string{"Deployment"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs, err := helmTemplate(t, tc.release, tc.namespace, tc.values, tc.set...)
			require.NoError(t, err)
			got := make([]string, 0, len(objs))
			for _, o := range objs {
				got = append(got, o.GetKind())
			}
			slices.Sort(got)
			require.Equal(t, tc.kinds, got, "rendered: %v", kinds(objs))
			for _, o := range objs {
				if o.GetKind() != "CustomResourceDefinition" && !strings.HasPrefix(o.GetKind(), "Cluster") {
					require.NotEmpty(t, o.GetNamespace(), "%s %s has no namespace", o.GetKind(), o.GetName())
				}
			}
			dryRunApply(t, objs)
		})
	}
}

// The chart's CRD is config/crd/bases, with the chart's labels and, by
// default, the annotation that keeps it on `helm uninstall`.
func TestChartCRDMatchesGenerated(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	templates, err := filepath.Glob(filepath.Join(chartDir, "templates", "crds", "*.yaml"))
	require.NoError(t, err)
	require.Len(t, templates, len(files), "one chart template per CRD: run `make manifests`")

	objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil)
	require.NoError(t, err)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var want map[string]any
		require.NoError(t, yaml.Unmarshal(data, &want))
		name, _, _ := unstructured.NestedString(want, "metadata", "name")
		got := find(t, objs, "CustomResourceDefinition", name).DeepCopy()
		require.Equal(t, "keep", got.GetAnnotations()["helm.sh/resource-policy"])
		require.Equal(t, "outbox-operator", got.GetLabels()["app.kubernetes.io/instance"])
		annotations := got.GetAnnotations()
		delete(annotations, "helm.sh/resource-policy")
		got.SetAnnotations(annotations)
		unstructured.RemoveNestedField(got.Object, "metadata", "labels")
		require.Equal(t, want, got.Object, "the chart's copy of %s is stale: run `make manifests`", filepath.Base(f))
	}

	objs, err = helmTemplate(t, "outbox-operator", "outbox-system", nil, "crds.keep=false")
	require.NoError(t, err)
	for _, crd := range ofKind(objs, "CustomResourceDefinition") {
		require.NotContains(t, crd.GetAnnotations(), "helm.sh/resource-policy")
	}
	objs, err = helmTemplate(t, "outbox-operator", "outbox-system", nil, "crds.install=false")
	require.NoError(t, err)
	require.Empty(t, ofKind(objs, "CustomResourceDefinition"))
}

// The chart's manager rules are config/rbac/role.yaml's, as `make manifests`
// copies them.
func TestChartRulesFileMatchesGenerated(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(chartDir, "files", "manager-rules.yaml"))
	require.NoError(t, err)
	var file struct {
		Rules []any `json:"rules"`
	}
	require.NoError(t, yaml.UnmarshalStrict(data, &file))
	roleData, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
	require.NoError(t, err)
	var role map[string]any
	require.NoError(t, yaml.Unmarshal(roleData, &role))
	require.Equal(t, role["rules"], file.Rules,
		"charts/outbox-operator/files/manager-rules.yaml is stale: run `make manifests`")
}

// manager returns the rendered Deployment and its manager container.
func manager(t testing.TB, objs []*unstructured.Unstructured, name string) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(find(t, objs, "Deployment", name).Object, &d))
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	c := d.Spec.Template.Spec.Containers[0]
	require.Equal(t, "manager", c.Name)
	return &d, c
}

// env returns the value of the container's env var name ("" when unset).
func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// envFrom returns the source of the container's env var name (nil when
// unset or a plain value).
func envFrom(c corev1.Container, name string) *corev1.EnvVarSource {
	for _, e := range c.Env {
		if e.Name == name {
			return e.ValueFrom
		}
	}
	return nil
}

// memoryLimitFromContainer is how the manifests pass the manager its
// container's memory limit, for its soft memory limit.
var memoryLimitFromContainer = &corev1.EnvVarSource{
	ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "manager", Resource: "limits.memory"},
}

// argsWithPrefix returns the container args that start with prefix.
func argsWithPrefix(c corev1.Container, prefix string) []string {
	var out []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			out = append(out, a)
		}
	}
	return out
}

func TestChartManagerDeployment(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil)
		require.NoError(t, err)
		d, c := manager(t, objs, "outbox-operator")
		chart := chartMeta(t)
		image := "ghcr.io/outbox-dev/outbox-operator:" + chart.AppVersion
		require.Equal(t, image, c.Image)
		require.Equal(t, image, env(c, "OPERATOR_IMAGE"), "relays default to the operator's own image")
		require.Equal(t, memoryLimitFromContainer, envFrom(c, "CONTAINER_MEMORY_LIMIT"), "the soft memory limit follows the container's")
		require.Empty(t, argsWithPrefix(c, "--relay-image"))
		require.Empty(t, argsWithPrefix(c, "--watch-namespaces"))
		require.Equal(t, []string{"/manager"}, c.Command)
		require.Equal(t, []string{"--leader-elect=true"}, argsWithPrefix(c, "--leader-elect"))
		require.Equal(t, []string{"--log-level=info"}, argsWithPrefix(c, "--log-level"))
		require.Equal(t, []string{"--metrics-bind-address=:8443"}, argsWithPrefix(c, "--metrics-bind-address"))
		require.Equal(t, []string{"--metrics-secure=true"}, argsWithPrefix(c, "--metrics-secure"))
		require.Empty(t, argsWithPrefix(c, "--metrics-cert-dir"), "a self-signed certificate by default")
		require.Empty(t, argsWithPrefix(c, "--enable-http2"), "HTTP/2 off by default")
		require.Empty(t, argsWithPrefix(c, "--backlog-max-concurrent-dials"), "the manager's default: half of the connections")
		require.Equal(t, "outbox-operator", d.Spec.Template.Spec.ServiceAccountName)
		require.Equal(t, int32(1), *d.Spec.Replicas)

		// The restricted Pod Security profile.
		pod := d.Spec.Template.Spec
		require.True(t, *pod.SecurityContext.RunAsNonRoot)
		require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SecurityContext.SeccompProfile.Type)
		require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
		require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
		require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)

		require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
		require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
		require.False(t, c.Resources.Requests.Memory().IsZero())
		require.False(t, c.Resources.Limits.Memory().IsZero())

		// The pods are not the relays' (app.kubernetes.io/name: outbox-relay).
		require.Equal(t, "outbox-operator", d.Spec.Selector.MatchLabels["app.kubernetes.io/name"])
		svc := find(t, objs, "Service", "outbox-operator-metrics")
		selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		require.Equal(t, d.Spec.Selector.MatchLabels, selector)
	})

	t.Run("NonDefaults", func(t *testing.T) {
		t.Parallel()
		objs, err := helmTemplate(t, "ops", "platform", []string{"ci/namespaced-values.yaml"})
		require.NoError(t, err)
		d, c := manager(t, objs, "outbox-relays-operator")
		require.Equal(t, "registry.example.com/platform/outbox-operator:v1.2.3", c.Image)
		require.Equal(t, c.Image, env(c, "OPERATOR_IMAGE"))
		require.Equal(t, []string{"--relay-image=registry.example.com/platform/outbox-relay:v1.2.3"}, argsWithPrefix(c, "--relay-image"))
		require.Equal(t, []string{"--watch-namespaces=team-a,team-b"}, argsWithPrefix(c, "--watch-namespaces"))
		require.Equal(t, []string{"--log-level=debug"}, argsWithPrefix(c, "--log-level"))
		require.Equal(t, []string{"--metrics-bind-address=:9090"}, argsWithPrefix(c, "--metrics-bind-address"))
		require.Equal(t, []string{"--backlog-check-timeout=15s"}, argsWithPrefix(c, "--backlog-check-timeout"))
		require.Equal(t, []string{"--backlog-max-concurrent-dials=8"}, argsWithPrefix(c, "--backlog-max-concurrent-dials"))
		require.Equal(t, "200MiB", env(c, "GOMEMLIMIT"))
		require.Equal(t, int32(2), *d.Spec.Replicas)
		require.Equal(t, corev1.PullAlways, c.ImagePullPolicy)
		pod := d.Spec.Template
		require.Equal(t, "platform", pod.Annotations["example.com/team"])
		require.Equal(t, "control-plane", pod.Labels["example.com/tier"])
		require.Equal(t, map[string]string{"kubernetes.io/os": "linux"}, pod.Spec.NodeSelector)
		require.Len(t, pod.Spec.Tolerations, 1)
		require.NotNil(t, pod.Spec.Affinity.PodAntiAffinity)
		require.Len(t, pod.Spec.TopologySpreadConstraints, 1)
		require.Equal(t, []corev1.LocalObjectReference{{Name: "registry-credentials"}}, pod.Spec.ImagePullSecrets)
		require.Equal(t, "outbox-operator-sa", pod.Spec.ServiceAccountName)
		require.Equal(t, "1", c.Resources.Limits.Cpu().String())
	})

	t.Run("Digest", func(t *testing.T) {
		t.Parallel()
		digest := "sha256:" + strings.Repeat("0f", 32)
		objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil, "image.digest="+digest, "image.tag=ignored")
		require.NoError(t, err)
		_, c := manager(t, objs, "outbox-operator")
		require.Equal(t, "ghcr.io/outbox-dev/outbox-operator@"+digest, c.Image)
		require.Equal(t, c.Image, env(c, "OPERATOR_IMAGE"))
	})

	t.Run("MetricsOff", func(t *testing.T) {
		t.Parallel()
		objs, err := helmTemplate(t, "outbox-operator", "outbox-system", nil, "metrics.enabled=false")
		require.NoError(t, err)
		_, c := manager(t, objs, "outbox-operator")
		require.Equal(t, []string{"--metrics-bind-address=0"}, argsWithPrefix(c, "--metrics-bind-address"))
		require.Empty(t, ofKind(objs, "Service"))
		for _, p := range c.Ports {
			require.NotEqual(t, "metrics", p.Name)
		}
	})
}

// chartMeta reads Chart.yaml.
func chartMeta(t testing.TB) struct{ Version, AppVersion string } {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	require.NoError(t, err)
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(data, &meta))
	require.NotEmpty(t, meta.AppVersion)
	return struct{ Version, AppVersion string }{meta.Version, meta.AppVersion}
}

// The ServiceMonitor scrapes the metrics Service: its selector matches the
// Service's labels and its endpoint names the Service's port.
func TestChartServiceMonitorSelectsMetricsService(t *testing.T) {
	t.Parallel()
	objs, err := helmTemplate(t, "monitored", "monitoring-test", []string{"ci/servicemonitor-values.yaml"})
	require.NoError(t, err)
	sm := find(t, objs, "ServiceMonitor", "monitored-outbox-operator")
	svc := find(t, objs, "Service", "monitored-outbox-operator-metrics")
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	require.NotEmpty(t, selector)
	labels := svc.GetLabels()
	for k, v := range selector {
		require.Equal(t, v, labels[k], "Service label %s", k)
	}
	require.Equal(t, "prometheus", sm.GetLabels()["release"])
	namespaces, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
	require.Equal(t, []string{"monitoring-test"}, namespaces)
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	require.Len(t, ports, 1)
	require.Equal(t, ports[0].(map[string]any)["name"], endpoints[0].(map[string]any)["port"])
	require.Equal(t, "15s", endpoints[0].(map[string]any)["interval"])
}

// values.schema.json and the templates refuse values that cannot work.
func TestChartRejectsInvalidValues(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		set  []string
		want string
	}{
		"UnknownValue":             {[]string{"replicas=2"}, "additional properties 'replicas' not allowed"},
		"LogLevel":                 {[]string{"logLevel=verbose"}, "logLevel"},
		"WatchNamespaceName":       {[]string{"watchNamespaces={Team_A}"}, "watchNamespaces"},
		"DuplicateNamespace":       {[]string{"watchNamespaces={a,a}"}, "watchNamespaces"},
		"PullPolicy":               {[]string{"image.pullPolicy=Sometimes"}, "pullPolicy"},
		"EmptyRepository":          {[]string{"image.repository="}, "repository"},
		"Digest":                   {[]string{"image.digest=latest"}, "digest"},
		"ExtraArgNotAFlag":         {[]string{"extraArgs={verbose}"}, "extraArgs"},
		"MetricsOnHealthPort":      {[]string{"metrics.port=8081"}, "metrics.port"},
		"ReplicasNoLeader":         {[]string{"replicaCount=2", "leaderElection.enabled=false"}, "needs leaderElection.enabled"},
		"ServiceAccountNoName":     {[]string{"serviceAccount.create=false"}, "serviceAccount.name is required"},
		"NetworkPolicyNoDatabases": {[]string{"networkPolicy.manager.enabled=true"}, "name PostgreSQL and Redis"},
		"RelayPolicyNoNamespaces": {[]string{"networkPolicy.relays.enabled=true", "networkPolicy.postgres.to[0].ipBlock.cidr=10.0.0.0/8",
			"networkPolicy.redis.to[0].ipBlock.cidr=10.0.0.0/8"}, "needs networkPolicy.relays.namespaces"},
		"RunbookURL": {[]string{"prometheusRule.runbookBaseURL=runbooks"}, "runbookBaseURL"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := helmTemplateRaw(t, "outbox-operator", "outbox-system", nil, tc.set...)
			require.Error(t, err, "rendered:\n%s", out)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Every value in values.yaml is described by values.schema.json, and every
// property of the schema has a default in values.yaml, so the two do not
// drift apart.
func TestChartValuesMatchSchema(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var values map[string]any
	require.NoError(t, yaml.Unmarshal(data, &values))
	data, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	require.NoError(t, err)
	var schema struct {
		Properties map[string]any `json:"properties"`
	}
	require.NoError(t, yaml.Unmarshal(data, &schema))
	props := slices.Sorted(maps.Keys(schema.Properties))
	props = slices.DeleteFunc(props, func(k string) bool { return k == "global" })
	require.Equal(t, props, slices.Sorted(maps.Keys(values)))
}
