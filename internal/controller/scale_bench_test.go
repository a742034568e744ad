package controller

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Environment variables of BenchmarkOperatorScale.
const (
	// envBenchRelays sets the number of OutboxRelays (default 1000).
	envBenchRelays = "OUTBOX_BENCH_RELAYS"
	// envBenchManagerArgs adds flags to the manager, space-separated.
	envBenchManagerArgs = "OUTBOX_BENCH_MANAGER_ARGS"
	// envBenchManagerLog names a file to keep the manager's log in.
	envBenchManagerLog = "OUTBOX_BENCH_MANAGER_LOG"
)

// BenchmarkOperatorScale creates 1,000 OutboxRelays (each with its own DSN
// Secret and outbox table, on one real PostgreSQL) against an envtest API
// server, with the manager built from cmd/manager running as its own process,
// and prints: the time until every relay is Ready, the manager's peak RSS,
// and reconciles per second. A goroutine plays the Deployment controller
// (envtest runs none): it reports every relay Deployment as available.
//
//	go test -run '^$' -bench OperatorScale -benchtime 1x ./internal/controller/
func BenchmarkOperatorScale(b *testing.B) {
	n := benchInt(b, envBenchRelays, 1000)
	for range b.N {
		res := runScale(b, n)
		b.ReportMetric(res.toReady.Seconds(), "s-to-ready")
		b.ReportMetric(float64(res.peakRSS)/(1<<20), "MiB-peak-rss")
		b.ReportMetric(res.reconcilesPerSecond(), "reconciles/s")
		res.print(n)
	}
}

// scaleResult are the figures of one run.
type scaleResult struct {
	createTime time.Duration            // creating the OutboxRelays
	toReady    time.Duration            // from the first create until all are Ready
	reconciles float64                  // controller_runtime_reconcile_total at that time
	peakRSS    int64                    // VmHWM of the manager, bytes
	rssAfter   int64                    // VmRSS of the manager at the end, bytes
	steadyRate float64                  // reconciles per second in the 30 s after
	poolConns  int                      // backlog connections the manager held
	cpu        map[string]time.Duration // CPU time until all Ready, by process
	requests   []string                 // the API server's busiest request kinds
	// environment is the manager's environment as a default install's;
	// loadBefore and loadAfter the 1-minute load average at the first
	// create and at the end.
	environment, loadBefore, loadAfter string
}

func (r scaleResult) reconcilesPerSecond() float64 { return r.reconciles / r.toReady.Seconds() }

func (r scaleResult) print(n int) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	row := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	row("\nOperator scale: %d OutboxRelays, envtest API server, real PostgreSQL, %d CPUs", n, runtimeCPUs())
	row("figure\tvalue")
	row("creating the OutboxRelays\t%.1f s", r.createTime.Seconds())
	row("time until all Ready\t%.1f s", r.toReady.Seconds())
	row("reconciles until all Ready\t%.0f", r.reconciles)
	row("reconciles per second (until Ready)\t%.0f", r.reconcilesPerSecond())
	row("reconciles per second (30 s steady state)\t%.1f", r.steadyRate)
	row("manager peak RSS (VmHWM)\t%.0f MiB", float64(r.peakRSS)/(1<<20))
	row("manager RSS at the end\t%.0f MiB", float64(r.rssAfter)/(1<<20))
	row("backlog connections to PostgreSQL\t%d", r.poolConns)
	row("manager's environment\t%s", r.environment)
	row("load average of the machine at the start / at the end\t%s / %s", r.loadBefore, r.loadAfter)
	for _, p := range []string{"manager", "kube-apiserver", "etcd"} {
		row("CPU time of %s until all Ready\t%.1f s", p, r.cpu[p].Seconds())
	}
	for _, line := range r.requests {
		row("API requests %s", line)
	}
	_ = w.Flush()
}

func runtimeCPUs() int {
	out, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(out), "processor\t:")
}

func runScale(b *testing.B, n int) scaleResult {
	ctx := context.Background()
	s := startScaleEnv(b)

	// The database: one table per relay.
	tables := make([]string, n)
	for i := range n {
		tables[i] = benchTable(i)
	}
	dsn, conn := benchDatabase(b, tables)

	// The Secrets exist before the relays.
	s.createSecrets(b, n, func(i int) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("relay-%04d-db", i)},
			Data:       map[string][]byte{"dsn": []byte(dsn)},
		}
	})
	require.NoError(b, s.c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: "redis"},
		Data:       map[string][]byte{"url": []byte(testRedisURL)},
	}))

	mgr := s.startManager(b)

	loadBefore := loadAverage()
	b.ResetTimer()
	start := time.Now()
	res := scaleResult{loadBefore: loadBefore, createTime: s.createRelays(b, n, func(i int) *v1alpha1.OutboxRelay {
		relay := newRelay(benchNamespace, fmt.Sprintf("relay-%04d", i), withTable(benchTable(i)))
		relay.Spec.Redis.URLSecretRef.Name = "redis"
		return relay
	})}

	waitUntil(b, 5*time.Minute, mgr, func() (bool, string) {
		ready, reasons := countReady(b, s.relays, benchNamespace)
		return ready == n, fmt.Sprintf("only %d of %d OutboxRelays Ready; other reasons: %v", ready, n, reasons)
	})
	res.toReady = time.Since(start)
	res.reconciles = mgr.reconcileTotal(b)
	res.cpu = processCPUs(mgr)
	res.requests = apiRequests(b, s.cfg)
	b.StopTimer()

	time.Sleep(30 * time.Second)
	res.steadyRate = (mgr.reconcileTotal(b) - res.reconciles) / 30
	res.peakRSS, res.rssAfter = mgr.memory(b)
	res.poolConns = backlogConnections(b, conn)
	res.environment = mgr.environment()
	res.loadAfter = loadAverage()
	return res
}

// benchNamespace holds the objects of the operator-scale benchmarks.
const benchNamespace = "bench"

// scaleEnv is what the operator-scale benchmarks run against: an envtest API
// server with the namespace benchNamespace, a client, and a watch of the
// namespace's OutboxRelays. It stops in cleanup.
type scaleEnv struct {
	env *envtest.Environment
	cfg *rest.Config
	c   client.WithWatch
	// relays is the watch: the relays are watched, as `kubectl wait` would,
	// not listed over and over, so the API server's time goes to the
	// operator.
	relays cache.Cache
	dir    string
}

func startScaleEnv(b *testing.B) *scaleEnv {
	ctx := context.Background()
	ctrllog.SetLogger(logr.Discard()) // the benchmark's own watch logs nothing
	s := &scaleEnv{dir: b.TempDir()}
	s.env, s.cfg = startAPIServer(b)
	var err error
	s.c, err = client.NewWithWatch(s.cfg, client.Options{Scheme: newTestScheme()})
	require.NoError(b, err)
	require.NoError(b, s.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}))

	s.relays, err = cache.New(s.cfg, cache.Options{Scheme: newTestScheme(), DefaultNamespaces: map[string]cache.Config{benchNamespace: {}}})
	require.NoError(b, err)
	watchCtx, stopWatch := context.WithCancel(ctx)
	b.Cleanup(stopWatch)
	go func() { _ = s.relays.Start(watchCtx) }()
	_, err = s.relays.GetInformer(ctx, &v1alpha1.OutboxRelay{})
	require.NoError(b, err)
	require.True(b, s.relays.WaitForCacheSync(ctx))
	return s
}

// createSecrets creates n Secrets in benchNamespace, 16 at a time.
func (s *scaleEnv) createSecrets(b *testing.B, n int, secret func(i int) *corev1.Secret) {
	parallel(b, n, 16, func(i int) error {
		obj := secret(i)
		obj.Namespace = benchNamespace
		return s.c.Create(context.Background(), obj)
	})
}

// startManager starts the manager process and the goroutine that plays the
// Deployment controller; both stop in cleanup.
func (s *scaleEnv) startManager(b *testing.B) *managerProcess {
	mgr := startManagerProcess(b, s.env, s.dir)
	b.Cleanup(fakeDeploymentController(s.c))
	return mgr
}

// createRelays creates n OutboxRelays, 16 at a time, and returns how long
// that took.
func (s *scaleEnv) createRelays(b *testing.B, n int, relay func(i int) *v1alpha1.OutboxRelay) time.Duration {
	start := time.Now()
	parallel(b, n, 16, func(i int) error { return s.c.Create(context.Background(), relay(i)) })
	return time.Since(start)
}

// waitUntil polls done every 100 ms; after timeout it fails with done's
// summary and the tail of the manager's log.
func waitUntil(b *testing.B, timeout time.Duration, mgr *managerProcess, done func() (bool, string)) {
	deadline := time.Now().Add(timeout)
	for {
		ok, summary := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("after %s: %s\nmanager log tail:\n%s", timeout, summary, tail(mgr.logPath, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// benchInt reads a whole number from the environment variable name, or
// returns def when it is unset.
func benchInt(b *testing.B, name string, def int) int { return benchEnv(b, name, def, strconv.Atoi) }

// benchDuration reads a Go duration from the environment variable name, or
// returns def when it is unset.
func benchDuration(b *testing.B, name string, def time.Duration) time.Duration {
	return benchEnv(b, name, def, time.ParseDuration)
}

func benchEnv[T any](b *testing.B, name string, def T, parse func(string) (T, error)) T {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	require.NoError(b, err, name)
	return x
}

func benchTable(i int) string { return fmt.Sprintf("outbox_%04d", i) }

// benchDatabase creates a database with an outbox table of the default
// layout under each name, and returns its DSN and a connection to it that
// closes in cleanup.
func benchDatabase(b *testing.B, tables []string) (string, *pgx.Conn) {
	ctx := context.Background()
	dsn := testenv.Postgres(b)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	var ddl strings.Builder
	for _, table := range tables {
		ddl.WriteString(outbox.MustNew(table, outbox.Columns{}).DDL(outbox.DDLOptions{}))
		ddl.WriteString("\n")
	}
	_, err = conn.Exec(ctx, ddl.String())
	require.NoError(b, err)
	return dsn, conn
}

// parallel runs fn for 0..n-1 on workers goroutines, failing on the first
// error.
func parallel(b *testing.B, n, workers int, fn func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
}

// countReady counts the Ready OutboxRelays, and the reasons of the others.
func countReady(b *testing.B, c client.Reader, ns string) (int, map[string]int) {
	var list v1alpha1.OutboxRelayList
	require.NoError(b, c.List(context.Background(), &list, client.InNamespace(ns)))
	ready, reasons := 0, map[string]int{}
	for i := range list.Items {
		cond := meta.FindStatusCondition(list.Items[i].Status.Conditions, string(v1alpha1.ConditionReady))
		switch {
		case cond == nil:
			reasons["none"]++
		case cond.Status == metav1.ConditionTrue:
			ready++
		default:
			reasons[cond.Reason]++
		}
	}
	return ready, reasons
}

// managerProcess is cmd/manager running against envtest.
type managerProcess struct {
	cmd         *exec.Cmd
	logPath     string
	metricsAddr string
	// installEnv is what a default install adds to the manager's
	// environment (defaultInstallEnv), as NAME=value.
	installEnv []string
}

// defaultInstallEnv is the environment config/manager gives the manager's
// container beyond the operator's image: CONTAINER_MEMORY_LIMIT, its
// limits.memory in bytes through the downward API, from which the manager
// sets its soft memory limit. The benchmarks run the manager with it.
func defaultInstallEnv(b *testing.B) []string {
	raw, err := os.ReadFile("../../config/manager/manager.yaml")
	require.NoError(b, err)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var dep appsv1.Deployment
		require.NoError(b, yaml.Unmarshal([]byte(doc), &dep))
		if dep.Kind != "Deployment" {
			continue
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil {
					continue
				}
				ref := e.ValueFrom.ResourceFieldRef
				require.Equal(b, "limits.memory", ref.Resource, "the only resourceFieldRef of config/manager")
				limit := c.Resources.Limits.Memory()
				require.False(b, limit.IsZero(), "config/manager sets limits.memory")
				return []string{fmt.Sprintf("%s=%d", e.Name, limit.Value())}
			}
		}
	}
	b.Fatal("config/manager/manager.yaml passes no resourceFieldRef to the manager")
	return nil
}

// startManagerProcess builds cmd/manager and runs it with a kubeconfig of
// envtest; it is stopped (SIGTERM, then SIGKILL) in cleanup.
func startManagerProcess(b *testing.B, env *envtest.Environment, dir string) *managerProcess {
	bin := filepath.Join(dir, "manager")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/manager")
	out, err := build.CombinedOutput()
	require.NoError(b, err, "building cmd/manager: %s", out)

	user, err := env.AddUser(envtest.User{Name: "bench-manager", Groups: []string{"system:masters"}}, nil)
	require.NoError(b, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(b, err)
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	require.NoError(b, os.WriteFile(kubeconfigPath, kubeconfig, 0o600))

	m := &managerProcess{logPath: filepath.Join(dir, "manager.log"), metricsAddr: freeAddr(b), installEnv: defaultInstallEnv(b)}
	if p := os.Getenv(envBenchManagerLog); p != "" {
		m.logPath = p
	}
	logFile, err := os.Create(m.logPath)
	require.NoError(b, err)
	args := append([]string{
		"--kubeconfig=" + kubeconfigPath,
		"--metrics-bind-address=" + m.metricsAddr,
		"--metrics-secure=false", // scraped over plain HTTP on loopback
		"--health-probe-bind-address=" + freeAddr(b),
		"--relay-image=" + testImage,
	}, strings.Fields(os.Getenv(envBenchManagerArgs))...)
	m.cmd = exec.Command(bin, args...)
	// GOMEMLIMIT of the shell running the benchmark would win over the
	// default install's limit.
	m.cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMEMLIMIT=") }),
		m.installEnv...)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(b, m.cmd.Start())
	exited := make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(exited) }()
	m.waitStarted(b, exited)
	b.Cleanup(func() {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = m.cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	})
	return m
}

// waitStarted waits until the controller's workers run, its caches synced:
// the relays are then created against a running operator, as in a cluster.
// An OutboxRelay that exists when the manager starts comes with the initial
// list of its informer, which controller-runtime's priority queue serves at
// low priority, after every event of the relays created since: relays created
// while the manager started waited minutes for their first reconcile.
func (m *managerProcess) waitStarted(b *testing.B, exited <-chan struct{}) {
	deadline := time.After(2 * time.Minute)
	for {
		raw, err := os.ReadFile(m.logPath)
		require.NoError(b, err)
		if strings.Contains(string(raw), `"Starting workers"`) {
			return
		}
		select {
		case <-exited:
			b.Fatalf("the manager exited while starting:\n%s", tail(m.logPath, 20))
		case <-deadline:
			b.Fatalf("the manager's controller did not start within 2m:\n%s", tail(m.logPath, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startupField returns a field of the manager's "Starting manager" log
// line (JSON), or "?".
func (m *managerProcess) startupField(name string) string {
	raw, err := os.ReadFile(m.logPath)
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, `"Starting manager"`) {
			continue
		}
		var fields map[string]any
		if json.Unmarshal([]byte(line), &fields) == nil && fields[name] != nil {
			return fmt.Sprint(fields[name])
		}
	}
	return "?"
}

// environment describes the environment the manager ran with.
func (m *managerProcess) environment() string {
	return fmt.Sprintf("%s (config/manager's), soft memory limit %s", strings.Join(m.installEnv, " "), m.startupField("memoryLimit"))
}

// freeAddr returns a free loopback address.
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// reconcileTotal scrapes controller_runtime_reconcile_total of the
// OutboxRelay controller, every result summed.
func (m *managerProcess) reconcileTotal(b *testing.B) float64 {
	samples, err := m.scrape()
	require.NoError(b, err)
	total := 0.0
	for _, s := range samples {
		if s.name == "controller_runtime_reconcile_total" && s.label("controller") == ControllerName {
			total += s.value
		}
	}
	return total
}

// scrape reads the samples of the manager's /metrics.
func (m *managerProcess) scrape() ([]metricSample, error) {
	text, err := m.metricsText()
	if err != nil {
		return nil, err
	}
	return parseMetrics(strings.NewReader(text))
}

// metricsText reads the manager's /metrics (plain HTTP: --metrics-secure=false).
func (m *managerProcess) metricsText() (string, error) {
	resp, err := http.Get("http://" + m.metricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(raw), nil
}

// metricSample is one sample of the Prometheus text format.
type metricSample struct {
	name   string
	labels string // between the braces, as written
	value  float64
}

// label returns the value of one label, or "".
func (s metricSample) label(name string) string {
	_, after, ok := strings.Cut(s.labels, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, `"`)
	return v
}

// parseMetrics reads the samples of the Prometheus text format; it is
// enough for the metrics of Go servers (no label value holds "} ").
func parseMetrics(r io.Reader) ([]metricSample, error) {
	var out []metricSample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		var s metricSample
		series, value, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 {
			end := strings.LastIndex(line, "} ")
			if end < i {
				return nil, fmt.Errorf("malformed sample %q", line)
			}
			series, s.labels, value, ok = line[:i], line[i+1:end], line[end+2:], true
		}
		if !ok {
			return nil, fmt.Errorf("malformed sample %q", line)
		}
		s.name = series
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("sample %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// memory returns the manager's peak and current resident set size.
func (m *managerProcess) memory(b *testing.B) (peak, now int64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	require.NoError(b, err)
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmHWM:":
			peak = kb << 10
		case "VmRSS:":
			now = kb << 10
		}
	}
	return peak, now
}

// backlogConnections counts the operator's sessions on the server.
func backlogConnections(b *testing.B, conn *pgx.Conn) int {
	var n int
	require.NoError(b, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-operator'`).Scan(&n))
	return n
}

// fakeDeploymentController reports every relay Deployment as rolled out and
// available, as kube-controller-manager and the kubelets would.
func fakeDeploymentController(c client.WithWatch) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	work := make(chan client.ObjectKey, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(work)
		for ctx.Err() == nil {
			w, err := c.Watch(ctx, &appsv1.DeploymentList{}, client.MatchingLabels{LabelManagedBy: ManagedByOperator})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				dep, ok := ev.Object.(*appsv1.Deployment)
				if !ok || available(dep) {
					continue
				}
				select {
				case work <- client.ObjectKeyFromObject(dep):
				case <-ctx.Done():
				}
			}
			w.Stop()
		}
	})
	for range 4 {
		wg.Go(func() {
			for key := range work {
				_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
					dep := &appsv1.Deployment{}
					if err := c.Get(ctx, key, dep); err != nil || available(dep) {
						return client.IgnoreNotFound(err)
					}
					n := ptr.Deref(dep.Spec.Replicas, 1)
					dep.Status = appsv1.DeploymentStatus{
						ObservedGeneration: dep.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
					}
					return c.Status().Update(ctx, dep)
				})
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func available(dep *appsv1.Deployment) bool {
	n := ptr.Deref(dep.Spec.Replicas, 1)
	return dep.Status.ObservedGeneration >= dep.Generation && dep.Status.AvailableReplicas == n && dep.Status.UpdatedReplicas == n
}

// apiRequests returns the counts of the API server's requests by verb and
// resource, busiest first, from its apiserver_request_total metric.
func apiRequests(b *testing.B, cfg *rest.Config) []string {
	counts := apiRequestCounts(b, cfg)
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	out := make([]string, 0, 12)
	for _, k := range keys[:min(len(keys), 12)] {
		out = append(out, fmt.Sprintf("%s\t%.0f", k, counts[k]))
	}
	return out
}

// apiRequestCounts sums the API server's apiserver_request_total by
// "VERB resource[/subresource]", e.g. "PATCH outboxrelays/status".
func apiRequestCounts(b *testing.B, cfg *rest.Config) map[string]float64 {
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(b, err)
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	require.NoError(b, err)
	defer func() { _ = resp.Body.Close() }()
	samples, err := parseMetrics(resp.Body)
	require.NoError(b, err)
	counts := map[string]float64{}
	for _, s := range samples {
		if s.name != "apiserver_request_total" {
			continue
		}
		key := s.label("verb") + " " + s.label("resource")
		if sub := s.label("subresource"); sub != "" {
			key += "/" + sub
		}
		counts[key] += s.value
	}
	return counts
}

// processCPUs returns the CPU time so far of the manager, the kube-apiserver
// and etcd.
func processCPUs(mgr *managerProcess) map[string]time.Duration {
	cpu := map[string]time.Duration{"manager": processCPU(mgr.cmd.Process.Pid)}
	for name, pid := range childProcesses(os.Getpid(), "kube-apiserver", "etcd") {
		cpu[name] = processCPU(pid)
	}
	return cpu
}

// processCPU returns the user and system CPU time of a process.
func processCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command (which may hold spaces) start at state.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// childProcesses finds the children of parent with the given commands.
func childProcesses(parent int, names ...string) map[string]int {
	found := map[string]int{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		var name string
		var ppid int
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Name:"); ok {
				name = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		for _, n := range names {
			// /proc truncates names to 15 characters.
			if ppid == parent && strings.HasPrefix(n, name) {
				found[n] = pid
			}
		}
	}
	return found
}

// tail returns the last lines of a file.
func tail(path string, lines int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
