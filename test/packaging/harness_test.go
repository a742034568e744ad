package packaging

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// repoRoot is the repository, seen from this package's directory.
var repoRoot = testenv.RepoRoot(2)

// chartDir is the Helm chart.
var chartDir = filepath.Join(repoRoot, "charts", "outbox-operator")

// fieldOwner is the field manager of the dry-run applies.
const fieldOwner = "packaging-test"

// cmdTimeout bounds one helm, kustomize or make run.
const cmdTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	code := m.Run()
	if err := stopAPIServer(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// tool returns the path of a pinned tool in bin/ (or $HELM, $KUSTOMIZE).
func tool(t testing.TB, name string) string {
	t.Helper()
	path := os.Getenv(strings.ToUpper(name))
	if path == "" {
		path = filepath.Join(repoRoot, "bin", name)
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(t, "%s is missing (%v): run `make helm kustomize` (`make test` does it first)", path, err)
	}
	return path
}

// run runs a command in the repository and returns its stdout; stderr is
// quoted in the error.
func run(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// helmEnv keeps helm's cache, config and data out of $HOME.
func helmEnv(t testing.TB) []string {
	t.Helper()
	dir := t.TempDir()
	return []string{
		"HELM_CACHE_HOME=" + filepath.Join(dir, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"HELM_DATA_HOME=" + filepath.Join(dir, "data"),
	}
}

// helmTemplate renders the chart as release "release" in namespace, with the
// values files (relative to the chart) and --set flags, for the Kubernetes
// version of the test API server.
func helmTemplate(t testing.TB, release, namespace string, valuesFiles []string, set ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := helmTemplateRaw(t, release, namespace, valuesFiles, set...)
	if err != nil {
		return nil, err
	}
	objs, err := decodeYAML(out)
	require.NoError(t, err, "decoding helm template's output")
	return objs, nil
}

// helmTemplateRaw is helmTemplate without decoding.
func helmTemplateRaw(t testing.TB, release, namespace string, valuesFiles []string, set ...string) ([]byte, error) {
	t.Helper()
	helm := tool(t, "helm")
	args := make([]string, 0, 7+2*len(valuesFiles)+2*len(set))
	args = append(args, "template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion)
	for _, f := range valuesFiles {
		args = append(args, "--values", filepath.Join(chartDir, f))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(context.Background(), helmEnv(t), helm, args...)
}

// kubeVersion is what the chart is rendered for: the version of the envtest
// binaries ($ENVTEST_K8S_VERSION, default as in the Makefile).
// TestEnvtestServerVersion checks that the API server reports it.
var kubeVersion = "v" + strings.TrimPrefix(cmp.Or(os.Getenv("ENVTEST_K8S_VERSION"), "1.37.2"), "v")

// decodeYAML splits a multi-document YAML stream into objects, leaving out
// empty documents.
func decodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the one object of kind and name; it fails the test when there
// is none or more than one.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			found = append(found, o)
		}
	}
	require.Len(t, found, 1, "objects of kind %s named %s", kind, name)
	return found[0]
}

// ofKind returns the objects of kind.
func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// kinds lists "Kind/namespace/name" of every object, for messages.
func kinds(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
	}
	return out
}

// --- the API server ---------------------------------------------------------

// apiServer is one kube-apiserver and etcd for the whole package, started by
// the first test that needs it and stopped by TestMain.
var apiServer struct {
	once sync.Once
	env  *envtest.Environment
	cfg  *rest.Config
	c    client.Client
	err  error
}

// cluster returns a client of the shared API server, which has the
// OutboxRelay CRD (config/crd/bases) and cut-down ServiceMonitor, PodMonitor
// and PrometheusRule CRDs (testdata) installed.
func cluster(t testing.TB) client.Client {
	t.Helper()
	testenv.RequireEnvtestAssets(t)
	apiServer.once.Do(func() {
		env := &envtest.Environment{
			CRDDirectoryPaths: []string{
				filepath.Join(repoRoot, "config", "crd", "bases"),
				filepath.Join("testdata", "servicemonitor-crd.yaml"),
				filepath.Join("testdata", "podmonitor-crd.yaml"),
				filepath.Join("testdata", "prometheusrule-crd.yaml"),
			},
			ErrorIfCRDPathMissing: true,
		}
		cfg, err := env.Start()
		if err != nil {
			apiServer.err = fmt.Errorf("starting envtest: %w", err)
			return
		}
		apiServer.env, apiServer.cfg = env, cfg
		apiServer.c, apiServer.err = client.New(cfg, client.Options{})
	})
	require.NoError(t, apiServer.err)
	return apiServer.c
}

// stopAPIServer stops the shared API server, if a test started it.
func stopAPIServer() error {
	if apiServer.env == nil {
		return nil
	}
	return apiServer.env.Stop()
}

// serverVersion is the API server's git version.
func serverVersion(t testing.TB) string {
	t.Helper()
	cluster(t)
	dc, err := discovery.NewDiscoveryClientForConfig(apiServer.cfg)
	require.NoError(t, err)
	v, err := dc.ServerVersion()
	require.NoError(t, err)
	return v.GitVersion
}

// createNamespaces creates namespaces for real (a dry run of an object in a
// namespace needs the namespace); existing ones are fine.
func createNamespaces(t testing.TB, c client.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err, "creating namespace %s", name)
		}
	}
}

// dryRunApply applies every object with a server-side apply dry run (field
// validation is strict for apply): the API server validates each one as if
// it were installed, and stores nothing. Namespaces among the objects, and
// the namespaces the other objects are in, are created for real first.
func dryRunApply(t testing.TB, objs []*unstructured.Unstructured) {
	t.Helper()
	require.NotEmpty(t, objs, "nothing to apply")
	c := cluster(t)
	var namespaces []string
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			namespaces = append(namespaces, o.GetName())
		}
		if ns := o.GetNamespace(); ns != "" {
			namespaces = append(namespaces, ns)
		}
	}
	createNamespaces(t, c, namespaces...)
	ctx := context.Background()
	for _, o := range objs {
		err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()),
			client.DryRunAll, client.ForceOwnership, client.FieldOwner(fieldOwner))
		require.NoError(t, err, "server-side dry-run apply of %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
	}
}

func TestEnvtestServerVersion(t *testing.T) {
	t.Parallel()
	require.Equal(t, kubeVersion, serverVersion(t),
		"the chart is rendered for $ENVTEST_K8S_VERSION (default 1.37.2): set it to the version of $KUBEBUILDER_ASSETS")
}
