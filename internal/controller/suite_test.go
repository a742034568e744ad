package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// suiteTimeout bounds every wait of the envtest tests.
const suiteTimeout = 45 * time.Second

// testBacklogTimeout is the deadline of one backlog check in the suite, and
// of its connection, the first included: short, so that the test of a
// hanging database is quick, and long enough for another relay to be
// measured meanwhile on a busy machine.
const testBacklogTimeout = 5 * time.Second

// suite is a real kube-apiserver and etcd, with the CRD installed, and a
// manager running the OutboxRelay controller against them.
type suite struct {
	cfg     *rest.Config
	c       client.Client   // uncached
	cache   client.Reader   // the manager's cache
	logs    *syncbuf.Buffer // everything the manager logged
	metrics *prometheus.Registry
}

// newTestScheme knows the built-in kinds and the OutboxRelay.
func newTestScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// startAPIServer starts envtest with the generated CRD; it stops in cleanup.
func startAPIServer(t testing.TB) (*envtest.Environment, *rest.Config) {
	t.Helper()
	testenv.RequireEnvtestAssets(t)
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	require.NoError(t, err, "starting envtest")
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	cfg.QPS, cfg.Burst = -1, 0 // no client-side throttling, as ctrl.GetConfig
	return env, cfg
}

// startSuite starts the API server and a manager with the controller, set up
// as cmd/manager sets it up. Both stop when t ends.
func startSuite(t *testing.T) *suite {
	t.Helper()
	_, cfg := startAPIServer(t)
	s := &suite{cfg: cfg, logs: &syncbuf.Buffer{}, metrics: prometheus.NewRegistry()}
	scheme := newTestScheme()
	var err error
	s.c, err = client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	var out io.Writer = s.logs
	if os.Getenv("OUTBOX_TEST_MANAGER_LOGS") != "" {
		out = io.MultiWriter(s.logs, os.Stderr)
	}
	logger := logr.FromSlogHandler(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.Level(-4)}))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 logger,
		Cache:                  CacheOptions(nil),
		Client:                 ClientOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	relayMetrics := NewRelayMetrics()
	require.NoError(t, s.metrics.Register(relayMetrics))
	ctx, cancel := context.WithCancel(context.Background())
	r := &OutboxRelayReconciler{
		Client:     mgr.GetClient(),
		APIReader:  mgr.GetAPIReader(),
		Scheme:     mgr.GetScheme(),
		Recorder:   mgr.GetEventRecorder("outbox-operator"),
		RelayImage: testImage,
		Checks: backlog.Config{
			Timeout: testBacklogTimeout, ConnectTimeout: testBacklogTimeout, FirstConnectTimeout: testBacklogTimeout,
		},
		Metrics:                 relayMetrics,
		MaxConcurrentReconciles: 4,
	}
	require.NoError(t, r.SetupWithManager(ctx, mgr))
	s.cache = mgr.GetCache()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "manager")
		case <-time.After(30 * time.Second):
			t.Error("the manager did not stop within 30s")
		}
	})
	return s
}

// namespace creates a namespace for one test.
func (s *suite) namespace(t *testing.T, labels ...string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   strings.ReplaceAll(testenv.Name(t), "_", "-"),
		Labels: map[string]string{},
	}}
	for i := 0; i+1 < len(labels); i += 2 {
		ns.Labels[labels[i]] = labels[i+1]
	}
	require.NoError(t, s.c.Create(context.Background(), ns))
	return ns.Name
}

// database returns the DSN of a new database with the default outbox table,
// and a connection to it.
func database(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, outbox.MustNew("", outbox.Columns{}).DDL(outbox.DDLOptions{}))
	require.NoError(t, err)
	return dsn, conn
}

// testRedisURL is the Redis URL of the fixtures; the operator never connects
// to Redis, the relay pods (which do not run in envtest) do.
const testRedisURL = "redis://127.0.0.1:6379/0"

// createSecret creates (or replaces the data of) a Secret with one key.
func (s *suite) createSecret(t *testing.T, ns, name, key, value string) {
	t.Helper()
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	err := s.c.Get(ctx, client.ObjectKeyFromObject(secret), secret)
	switch {
	case apierrors.IsNotFound(err):
		secret.Data = map[string][]byte{key: []byte(value)}
		require.NoError(t, s.c.Create(ctx, secret))
	case err == nil:
		secret.Data = map[string][]byte{key: []byte(value)}
		require.NoError(t, s.c.Update(ctx, secret))
	default:
		require.NoError(t, err)
	}
}

// createSecrets creates the two Secrets newRelay refers to.
func (s *suite) createSecrets(t *testing.T, ns, relayName, dsn string) {
	t.Helper()
	s.createSecret(t, ns, relayName+"-db", "dsn", dsn)
	s.createSecret(t, ns, relayName+"-redis", "url", testRedisURL)
}

// createRelay creates an OutboxRelay from a fixture (its status is ignored).
func (s *suite) createRelay(t *testing.T, relay *v1alpha1.OutboxRelay) {
	t.Helper()
	require.NoError(t, s.c.Create(context.Background(), relay))
}

// updateRelay applies change to the stored OutboxRelay, retrying conflicts.
func (s *suite) updateRelay(t *testing.T, key types.NamespacedName, change func(*v1alpha1.OutboxRelay)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		relay := &v1alpha1.OutboxRelay{}
		if err := s.c.Get(context.Background(), key, relay); err != nil {
			return err
		}
		change(relay)
		return s.c.Update(context.Background(), relay)
	})
	require.NoError(t, err)
}

// eventually polls check until it returns nil, or fails the test with the
// last error after suiteTimeout.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	testenv.EventuallyEvery(t, 100*time.Millisecond, suiteTimeout, what, check)
}

// relay reads an OutboxRelay.
func (s *suite) relay(t *testing.T, key types.NamespacedName) *v1alpha1.OutboxRelay {
	t.Helper()
	relay := &v1alpha1.OutboxRelay{}
	require.NoError(t, s.c.Get(context.Background(), key, relay))
	return relay
}

// waitCondition waits until the relay's condition has the status and reason,
// and returns the relay as it was then.
func (s *suite) waitCondition(t *testing.T, key types.NamespacedName, typ v1alpha1.ConditionType,
	status metav1.ConditionStatus, reason v1alpha1.Reason,
) *v1alpha1.OutboxRelay {
	t.Helper()
	var relay *v1alpha1.OutboxRelay
	eventually(t, fmt.Sprintf("%s %s=%s (%s)", key, typ, status, reason), func() error {
		relay = &v1alpha1.OutboxRelay{}
		if err := s.c.Get(context.Background(), key, relay); err != nil {
			return err
		}
		c := meta.FindStatusCondition(relay.Status.Conditions, string(typ))
		if c == nil {
			return fmt.Errorf("no %s condition yet; conditions: %v", typ, relay.Status.Conditions)
		}
		if c.Status != status || c.Reason != string(reason) {
			return fmt.Errorf("%s is %s (%s): %s", typ, c.Status, c.Reason, c.Message)
		}
		return nil
	})
	return relay
}

// waitStatus waits until check accepts the relay's status.
func (s *suite) waitStatus(t *testing.T, key types.NamespacedName, what string,
	check func(*v1alpha1.OutboxRelayStatus) error,
) *v1alpha1.OutboxRelay {
	t.Helper()
	var relay *v1alpha1.OutboxRelay
	eventually(t, what, func() error {
		relay = &v1alpha1.OutboxRelay{}
		if err := s.c.Get(context.Background(), key, relay); err != nil {
			return err
		}
		return check(&relay.Status)
	})
	return relay
}

// deployment waits for the relay's Deployment and returns it.
func (s *suite) deployment(t *testing.T, key types.NamespacedName) *appsv1.Deployment {
	t.Helper()
	dep := &appsv1.Deployment{}
	eventually(t, "the Deployment of "+key.String(), func() error {
		return s.c.Get(context.Background(), types.NamespacedName{Namespace: key.Namespace, Name: key.Name + "-relay"}, dep)
	})
	return dep
}

// waitDeployment waits until check accepts the relay's Deployment.
func (s *suite) waitDeployment(t *testing.T, key types.NamespacedName, what string,
	check func(*appsv1.Deployment) error,
) *appsv1.Deployment {
	t.Helper()
	var dep *appsv1.Deployment
	eventually(t, what, func() error {
		dep = &appsv1.Deployment{}
		if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: key.Namespace, Name: key.Name + "-relay"}, dep); err != nil {
			return err
		}
		return check(dep)
	})
	return dep
}

// markAvailable plays the Deployment controller, which envtest does not run:
// it reports every desired pod of the relay's Deployment as available.
func (s *suite) markAvailable(t *testing.T, key types.NamespacedName) {
	t.Helper()
	s.deployment(t, key)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dep := &appsv1.Deployment{}
		if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: key.Namespace, Name: key.Name + "-relay"}, dep); err != nil {
			return err
		}
		n := ptr.Deref(dep.Spec.Replicas, 1)
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           n,
			UpdatedReplicas:    n,
			ReadyReplicas:      n,
			AvailableReplicas:  n,
		}
		return s.c.Status().Update(context.Background(), dep)
	})
	require.NoError(t, err)
}
