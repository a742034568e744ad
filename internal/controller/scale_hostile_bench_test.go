package controller

import (
	"context"
	"crypto/rand"
	"fmt"
	mathrand "math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Environment variables of BenchmarkOperatorScaleHostile. OUTBOX_BENCH_RELAYS
// sets the total (default 1000); each kind of relay defaults to its share of
// the total in issue #15: half blackholes, 30% databases of their own, 1% with
// a file-reading DSN key (at least one), and the rest on the shared database.
// OUTBOX_BENCH_MANAGER_ARGS and OUTBOX_BENCH_MANAGER_LOG work as for
// BenchmarkOperatorScale.
const (
	envBenchBlackholes = "OUTBOX_BENCH_BLACKHOLES"
	envBenchDatabases  = "OUTBOX_BENCH_DATABASES"
	envBenchFileKeys   = "OUTBOX_BENCH_FILE_KEYS"
	// envBenchSteady is the window in which status writes are counted once
	// every relay has its final condition (default 60s: two check
	// intervals).
	envBenchSteady = "OUTBOX_BENCH_STEADY"
	// envBenchSettle bounds the wait for every relay's final condition
	// (default 10m); it is a correctness bound, not a goal.
	envBenchSettle = "OUTBOX_BENCH_SETTLE"
)

// BenchmarkOperatorScaleHostile is BenchmarkOperatorScale with the tenants
// of issue #15: of 1,000 OutboxRelays, 500 point at databases that accept
// connections and never answer (loopback listeners), 300 at databases of
// their own (each with its own user) on the test PostgreSQL, 10 carry a DSN
// key that reads a file of the operator's pod, and the other 190 have tables
// on one shared database. Every Secret's password is a canary, unique to the
// Secret. It prints the time until every reachable relay is Ready, the
// manager's RSS, the peaks of the backlog prober's gauges against their
// bounds (and the manager's connections seen from outside: its sockets in
// /proc, the blackholes' own count), and status writes per relay per check
// interval once settled. It asserts correctness only: each relay ends with
// the right condition, no bound is exceeded, no relay's status is written
// more than once per check interval, and no canary is in the manager's log,
// an Event, an OutboxRelay's spec or status, a Deployment, a CronJob or the
// manager's metrics.
//
//	go test -run '^$' -bench OperatorScaleHostile -benchtime 1x -timeout 60m ./internal/controller/
func BenchmarkOperatorScaleHostile(b *testing.B) {
	mix := hostileMixFromEnv(b)
	for range b.N {
		res := runScaleHostile(b, mix)
		b.ReportMetric(res.toReady.Seconds(), "s-to-ready")
		b.ReportMetric(float64(res.peakRSS)/(1<<20), "MiB-peak-rss")
		b.ReportMetric(res.writesPerInterval, "status-writes/relay/interval")
		res.print(mix)
		res.check(b, mix)
	}
}

// relayKind is what an OutboxRelay of the hostile benchmark points at.
type relayKind int

const (
	kindShared    relayKind = iota // a table on the shared database
	kindDatabase                   // a database of its own, with its own user
	kindBlackhole                  // a loopback listener that accepts and never answers
	kindFileKey                    // the shared database, with a DSN key that reads a file
	kindCount
)

func (k relayKind) String() string {
	return [...]string{"shared database", "own database", "blackhole", "file-reading DSN key"}[k]
}

// reachable reports whether a relay of the kind must become Ready.
func (k relayKind) reachable() bool { return k == kindShared || k == kindDatabase }

// final is the DatabaseReachable condition a relay of the kind ends with.
func (k relayKind) final() (metav1.ConditionStatus, v1alpha1.Reason) {
	switch k {
	case kindBlackhole:
		return metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable
	case kindFileKey:
		return metav1.ConditionFalse, v1alpha1.ReasonDSNKeyNotAllowed
	}
	return metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured
}

// hostileMix is how many relays of each kind the benchmark creates.
type hostileMix [kindCount]int

func hostileMixFromEnv(b *testing.B) hostileMix {
	n := benchInt(b, envBenchRelays, 1000)
	var m hostileMix
	m[kindBlackhole] = benchInt(b, envBenchBlackholes, n/2)
	m[kindDatabase] = benchInt(b, envBenchDatabases, n*3/10)
	m[kindFileKey] = benchInt(b, envBenchFileKeys, max(1, n/100))
	m[kindShared] = n - m[kindBlackhole] - m[kindDatabase] - m[kindFileKey]
	require.GreaterOrEqual(b, m[kindShared], 0, "%s must be at least the sum of the other kinds", envBenchRelays)
	return m
}

func (m hostileMix) total() int {
	return m[kindShared] + m[kindDatabase] + m[kindBlackhole] + m[kindFileKey]
}

func (m hostileMix) reachable() int { return m[kindShared] + m[kindDatabase] }

// kinds returns the kind of each relay, in an order shuffled with a fixed
// seed, so that the relays of every kind are created (and first checked)
// mixed.
func (m hostileMix) kinds() []relayKind {
	kinds := make([]relayKind, 0, m.total())
	for k, n := range m {
		for range n {
			kinds = append(kinds, relayKind(k))
		}
	}
	mathrand.New(mathrand.NewPCG(15, 5)).Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	return kinds
}

// canaryPrefix starts the password of every Secret of the benchmark; the
// rest is the relay's number and random letters, so that each Secret's
// password is unique and a leak names its relay.
const canaryPrefix = "Canary-5e1f0b-"

func newCanary(i int) string { return fmt.Sprintf("%s%04d-%s", canaryPrefix, i, rand.Text()[:12]) }

// fileKeys are the DSN keys the file-key relays set, in turn; each reads a
// file of the operator's pod.
var fileKeys = []string{"sslrootcert=/etc/passwd", "passfile=/etc/passwd", "sslkey=/etc/shadow", "servicefile=/etc/passwd"}

// withUser returns dsn (a postgres:// URL) with another user and password.
func withUser(b *testing.B, dsn, user, password string) string {
	u, err := url.Parse(dsn)
	require.NoError(b, err)
	u.User = url.UserPassword(user, password)
	if password == "" {
		u.User = url.User(user)
	}
	return u.String()
}

// hostileResult are the figures of one run.
type hostileResult struct {
	setup, createTime  time.Duration
	toReady, toSettled time.Duration // from the first create
	peakRSS, rssAfter  int64
	cpu                map[string]time.Duration // until settled
	bounds             boundPeaks
	blackholePeak      int64 // connections open at once at the blackholes
	poolConnsAfter     int   // the operator's sessions in pg_stat_activity at the end
	// loadBefore and loadAfter are the 1-minute load average, read when
	// the relays are created and at the end: other work on the machine moves
	// every figure.
	loadBefore, loadAfter string
	// environment is the manager's environment as a default install's.
	environment string

	steady            time.Duration
	interval          time.Duration
	statusPatches     float64 // PATCH outboxrelays/status in the steady window
	writesPerInterval float64 // statusPatches per relay per interval
	writesByKind      [kindCount]kindWrites

	final    hostileObservation // at the end
	leaks    map[string]string  // where a canary was found
	searched map[string]int     // bytes searched, by place
	requests []string
}

// kindWrites are the status writes to the relays of one kind that the
// benchmark's watch saw in the steady window.
type kindWrites struct {
	total, maxPerRelay int
}

func runScaleHostile(b *testing.B, mix hostileMix) hostileResult {
	setupStart := time.Now()
	s := startScaleEnv(b)
	kinds := mix.kinds()
	n := len(kinds)

	// The shared database, with a table per relay that uses it.
	var tables []string
	for i, k := range kinds {
		if k == kindShared || k == kindFileKey {
			tables = append(tables, benchTable(i))
		}
	}
	sharedDSN, conn := benchDatabase(b, tables)
	own := ownDatabases(b, conn, kinds)
	holes := &blackholes{}
	pgPort, holePorts := portOf(b, sharedDSN), map[int]bool{}

	// One Secret per relay, with the DSN and the Redis URL, both with the
	// relay's canary as password.
	dsns, canaries := make([]string, n), make([]string, n)
	for i, k := range kinds {
		canaries[i] = newCanary(i)
		switch k {
		case kindShared:
			dsns[i] = withUser(b, sharedDSN, "postgres", canaries[i])
		case kindDatabase:
			dsns[i] = withUser(b, own[i].dsn, own[i].user, canaries[i])
		case kindBlackhole:
			port := holes.listen(b)
			holePorts[port] = true
			dsns[i] = fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/app?sslmode=disable", canaries[i], port)
		case kindFileKey:
			dsns[i] = withUser(b, sharedDSN, "postgres", canaries[i]) + "&" + fileKeys[i%len(fileKeys)]
		}
	}
	s.createSecrets(b, n, func(i int) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("relay-%04d-db", i)},
			Data: map[string][]byte{
				"dsn": []byte(dsns[i]),
				"url": []byte("redis://:" + canaries[i] + "@127.0.0.1:6379/0"),
			},
		}
	})

	writes := watchStatusWrites(b, s.relays)
	mgr := s.startManager(b)
	sampler := startBoundsSampler(mgr, pgPort, holePorts)
	res := hostileResult{setup: time.Since(setupStart)}

	res.loadBefore = loadAverage()
	b.ResetTimer()
	start := time.Now()
	res.createTime = s.createRelays(b, n, func(i int) *v1alpha1.OutboxRelay {
		name := fmt.Sprintf("relay-%04d", i)
		var opts []relayOption
		if kinds[i] == kindShared || kinds[i] == kindFileKey {
			opts = append(opts, withTable(benchTable(i)))
		}
		relay := newRelay(benchNamespace, name, opts...)
		relay.Spec.Redis.URLSecretRef.Name = name + "-db"
		return relay
	})

	waitUntil(b, benchDuration(b, envBenchSettle, 10*time.Minute), mgr, func() (bool, string) {
		obs := observeHostile(b, s.relays, kinds)
		if res.toReady == 0 && obs.ready == mix.reachable() {
			res.toReady = time.Since(start)
		}
		return obs.settled(mix), obs.String()
	})
	res.toSettled = time.Since(start)
	res.cpu = processCPUs(mgr)
	b.StopTimer()

	// Settled: count the status writes over a window of whole intervals.
	res.interval = v1alpha1.DefaultBacklogCheckInterval
	res.steady = benchDuration(b, envBenchSteady, 2*res.interval)
	before, from := apiRequestCounts(b, s.cfg)["PATCH outboxrelays/status"], time.Now()
	time.Sleep(res.steady)
	res.statusPatches = apiRequestCounts(b, s.cfg)["PATCH outboxrelays/status"] - before
	intervals := res.steady.Seconds() / res.interval.Seconds()
	res.writesPerInterval = res.statusPatches / float64(n) / intervals
	for name, count := range writes.since(from) {
		i, err := strconv.Atoi(strings.TrimPrefix(name, "relay-"))
		require.NoError(b, err)
		w := &res.writesByKind[kinds[i]]
		w.total += count
		w.maxPerRelay = max(w.maxPerRelay, count)
	}

	res.final = observeHostile(b, s.relays, kinds)
	res.bounds = sampler.stop()
	res.blackholePeak = holes.peak.Load()
	res.peakRSS, res.rssAfter = mgr.memory(b)
	res.poolConnsAfter = backlogConnections(b, conn)
	res.loadAfter = loadAverage()
	res.environment = mgr.environment()
	res.requests = apiRequests(b, s.cfg)

	// The canaries: the manager's log and metrics, and what the API server
	// holds about the relays.
	h := haystack{}
	counts := h.addNamespace(b, s.c, benchNamespace)
	require.NotZero(b, counts["Events"], "the relays have Events")
	log, err := os.ReadFile(mgr.logPath)
	require.NoError(b, err)
	h["manager log"] = string(log)
	metrics, err := mgr.metricsText()
	require.NoError(b, err)
	h["manager metrics"] = metrics
	res.leaks = h.find(canaryPrefix)
	res.searched = map[string]int{}
	for what, text := range h {
		res.searched[what] = len(text)
	}
	require.Contains(b, h["manager log"], benchNamespace, "the log records the relays, so the search is not in vain")
	return res
}

// loadAverage returns the 1-minute load average, or "?".
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(raw))[0]
}

// ownDatabase is a database of its own for one relay.
type ownDatabase struct {
	dsn  string // as user, no password
	user string // owns the database and its outbox table
}

// ownDatabases creates, for each relay of kindDatabase, a database on the
// test server owned by a user of its own, with the default outbox table
// created by that user. The databases are dropped (testenv), then the users.
func ownDatabases(b *testing.B, admin *pgx.Conn, kinds []relayKind) map[int]ownDatabase {
	ctx := context.Background()
	var users []string
	b.Cleanup(func() {
		// After the databases are dropped: a user who owns one cannot be.
		cleanupCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(cleanupCtx, admin.Config().ConnString())
		require.NoError(b, err)
		defer func() { _ = c.Close(cleanupCtx) }()
		for _, u := range users {
			_, err := c.Exec(cleanupCtx, "DROP ROLE IF EXISTS "+pgx.Identifier{u}.Sanitize())
			require.NoError(b, err)
		}
	})
	own := map[int]ownDatabase{}
	var idx []int
	for i, k := range kinds {
		if k != kindDatabase {
			continue
		}
		dsn := testenv.Postgres(b) // one at a time: CREATE DATABASE copies template1
		u, err := url.Parse(dsn)
		require.NoError(b, err)
		user := strings.TrimPrefix(u.Path, "/") + "_owner"
		_, err = admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{user}.Sanitize()+" LOGIN")
		require.NoError(b, err)
		users = append(users, user)
		_, err = admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s OWNER TO %s",
			pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize(), pgx.Identifier{user}.Sanitize()))
		require.NoError(b, err)
		own[i] = ownDatabase{dsn: withUser(b, dsn, user, ""), user: user}
		idx = append(idx, i)
	}
	ddl := outbox.MustNew("", outbox.Columns{}).DDL(outbox.DDLOptions{})
	parallel(b, len(idx), 4, func(j int) error {
		d := own[idx[j]]
		c, err := pgx.Connect(ctx, d.dsn)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close(ctx) }()
		_, err = c.Exec(ctx, ddl)
		return err
	})
	return own
}

// portOf returns the port of a postgres:// URL.
func portOf(b *testing.B, dsn string) int {
	u, err := url.Parse(dsn)
	require.NoError(b, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(b, err)
	return port
}

// hostileObservation is where the relays stand, by kind.
type hostileObservation struct {
	// ready counts the reachable relays that are Ready.
	ready int
	// done counts, by kind, the relays with their final DatabaseReachable
	// condition (and, if reachable, Ready).
	done hostileMix
	// others counts the other relays by kind and "condition=status reason".
	others map[string]int
	// slotBound counts the blackholes whose message says the bound on open
	// connections was reached, not that the database is unreachable.
	slotBound int
}

func observeHostile(b *testing.B, c cache.Cache, kinds []relayKind) hostileObservation {
	var list v1alpha1.OutboxRelayList
	require.NoError(b, c.List(context.Background(), &list))
	obs := hostileObservation{others: map[string]int{}}
	for i := range list.Items {
		relay := &list.Items[i]
		n, err := strconv.Atoi(strings.TrimPrefix(relay.Name, "relay-"))
		require.NoError(b, err)
		k := kinds[n]
		wantStatus, wantReason := k.final()
		db := findCondition(relay, v1alpha1.ConditionDatabaseReachable)
		ready := meta.IsStatusConditionTrue(relay.Status.Conditions, string(v1alpha1.ConditionReady))
		if k.reachable() && ready {
			obs.ready++
		}
		switch {
		case db != nil && db.Status == wantStatus && db.Reason == string(wantReason) && (ready || !k.reachable()):
			obs.done[k]++
			if k == kindBlackhole && strings.Contains(db.Message, "--backlog-max-open-conns") {
				obs.slotBound++
			}
		case db == nil:
			obs.others[k.String()+": no DatabaseReachable yet"]++
		case !ready && k.reachable() && db.Status == wantStatus:
			if cond := findCondition(relay, v1alpha1.ConditionReady); cond != nil {
				obs.others[fmt.Sprintf("%s: Ready=%s %s", k, cond.Status, cond.Reason)]++
			} else {
				obs.others[k.String()+": no Ready yet"]++
			}
		default:
			obs.others[fmt.Sprintf("%s: DatabaseReachable=%s %s", k, db.Status, db.Reason)]++
		}
	}
	return obs
}

// settled reports whether every relay has its final condition.
func (o hostileObservation) settled(mix hostileMix) bool { return o.done == mix }

func (o hostileObservation) String() string {
	return fmt.Sprintf("%d reachable relays Ready; final by kind %v; others: %v", o.ready, o.done, o.others)
}

// statusWrites records when the watch saw each relay change; the operator
// is the only writer of the relays once they exist, and writes only their
// status.
type statusWrites struct {
	mu sync.Mutex
	at map[string][]time.Time // by relay name
}

func watchStatusWrites(b *testing.B, c cache.Cache) *statusWrites {
	w := &statusWrites{at: map[string][]time.Time{}}
	inf, err := c.GetInformer(context.Background(), &v1alpha1.OutboxRelay{})
	require.NoError(b, err)
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			before, ok1 := oldObj.(*v1alpha1.OutboxRelay)
			after, ok2 := newObj.(*v1alpha1.OutboxRelay)
			if !ok1 || !ok2 || before.ResourceVersion == after.ResourceVersion {
				return // a resync
			}
			w.mu.Lock()
			w.at[after.Name] = append(w.at[after.Name], time.Now())
			w.mu.Unlock()
		},
	})
	require.NoError(b, err)
	return w
}

// since counts each relay's writes seen from t on.
func (w *statusWrites) since(t time.Time) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	counts := map[string]int{}
	for name, times := range w.at {
		for _, at := range times {
			if !at.Before(t) {
				counts[name]++
			}
		}
	}
	return counts
}

// boundPeaks are the highest values seen of the backlog prober's gauges
// (scraped from the manager every gaugeScrapeInterval) and of the manager's
// TCP connections to PostgreSQL and the blackholes (its sockets in /proc,
// every 200 ms).
type boundPeaks struct {
	gauges         map[string]float64 // outbox_operator_backlog_<name>, peak
	scrapes        int
	scrapeErrors   int
	sockets        int // to PostgreSQL and the blackholes at once
	socketsPG      int
	socketsHole    int
	socketSamples  int
	socketFailures int
}

// gaugeScrapeInterval is how often the sampler scrapes the manager's
// /metrics: more often than a Prometheus would (15 to 30 s), not so often
// that rendering the per-relay series of 1,000 relays becomes a load of its
// own on the manager. The sockets in /proc, which cost the manager nothing,
// are sampled every 200 ms.
const gaugeScrapeInterval = 5 * time.Second

type boundsSampler struct {
	stopCh chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	peaks  boundPeaks
}

// startBoundsSampler samples the manager until stop.
func startBoundsSampler(mgr *managerProcess, pgPort int, holePorts map[int]bool) *boundsSampler {
	s := &boundsSampler{stopCh: make(chan struct{}), peaks: boundPeaks{gauges: map[string]float64{}}}
	every := func(d time.Duration, sample func()) {
		s.wg.Go(func() {
			t := time.NewTicker(d)
			defer t.Stop()
			for {
				sample()
				select {
				case <-s.stopCh:
					return
				case <-t.C:
				}
			}
		})
	}
	every(gaugeScrapeInterval, func() {
		samples, err := mgr.scrape()
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.peaks.scrapeErrors++
			return
		}
		s.peaks.scrapes++
		for _, m := range samples {
			if name, ok := strings.CutPrefix(m.name, "outbox_operator_backlog_"); ok {
				s.peaks.gauges[name] = max(s.peaks.gauges[name], m.value)
			}
		}
	})
	every(200*time.Millisecond, func() {
		pg, holes, err := tcpConnsTo(mgr.cmd.Process.Pid, pgPort, holePorts)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.peaks.socketFailures++
			return
		}
		s.peaks.socketSamples++
		s.peaks.sockets = max(s.peaks.sockets, pg+holes)
		s.peaks.socketsPG = max(s.peaks.socketsPG, pg)
		s.peaks.socketsHole = max(s.peaks.socketsHole, holes)
	})
	return s
}

func (s *boundsSampler) stop() boundPeaks {
	close(s.stopCh)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peaks
}

// tcpConnsTo counts the TCP sockets (IPv4, in any state) a process has open
// to PostgreSQL's port and to the blackholes' ports. Neither the process's
// file descriptors (a directory read in several calls) nor the kernel's
// socket table are read at one instant: a descriptor closed early in the
// read and another opened late in it are both listed, though never open at
// once. So it counts only the sockets whose descriptor is listed both before
// and after the table is read, with the same inode: those open throughout,
// so all open at once. A socket opened or closed meanwhile is missed, never
// counted with one that replaced it.
func tcpConnsTo(pid, pgPort int, holePorts map[int]bool) (toPG, toHoles int, err error) {
	before, err := socketInodes(pid)
	if err != nil {
		return 0, 0, err
	}
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return 0, 0, err
	}
	after, err := socketInodes(pid)
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(table), "\n")[1:] {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) < 10 || !before[f[9]] || !after[f[9]] {
			continue
		}
		_, hexPort, _ := strings.Cut(f[2], ":")
		port, err := strconv.ParseUint(hexPort, 16, 32)
		switch {
		case err != nil:
		case int(port) == pgPort:
			toPG++
		case holePorts[int(port)]:
			toHoles++
		}
	}
	return toPG, toHoles, nil
}

// socketInodes returns the inodes of a process's sockets.
func socketInodes(pid int) (map[string]bool, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return inodes, nil
}

func (r hostileResult) print(mix hostileMix) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	row := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	g := r.bounds.gauges
	row("\nOperator scale, hostile tenants: %d OutboxRelays (%d blackholes, %d own databases, %d file-reading DSN keys, "+
		"%d on a shared database), envtest API server, real PostgreSQL, %d CPUs",
		mix.total(), mix[kindBlackhole], mix[kindDatabase], mix[kindFileKey], mix[kindShared], runtimeCPUs())
	row("figure\tvalue")
	row("setting up (API server, databases, Secrets, manager)\t%.1f s", r.setup.Seconds())
	row("creating the OutboxRelays\t%.1f s", r.createTime.Seconds())
	row("time until all %d reachable relays Ready\t%.1f s", mix.reachable(), r.toReady.Seconds())
	row("time until every relay had its final condition\t%.1f s", r.toSettled.Seconds())
	row("manager peak RSS (VmHWM)\t%.0f MiB", float64(r.peakRSS)/(1<<20))
	row("manager RSS at the end\t%.0f MiB", float64(r.rssAfter)/(1<<20))
	row("manager's environment\t%s", r.environment)
	row("backlog checks running their queries, peak / bound\t%.0f / %.0f", g["checks_running"], g["checks_max"])
	row("backlog checks queued for a dial slot, peak\t%.0f", g["checks_waiting"])
	row("backlog checks holding a dial slot, peak / bound\t%.0f / %.0f", g["dials_running"], g["dials_max"])
	row("backlog connections being made, peak / bound\t%.0f / %.0f", g["connections_dialing"], g["dials_max"])
	row("backlog connections open, peak / bound\t%.0f / %.0f", g["connections_open"], g["connections_max"])
	row("backlog checks waiting for a connection, peak\t%.0f", g["connections_waiting"])
	row("backlog pools, peak\t%.0f", g["pools"])
	row("(gauges: %d scrapes, %s apart; %d failed)\t", r.bounds.scrapes, gaugeScrapeInterval, r.bounds.scrapeErrors)
	row("size of the manager's /metrics at the end\t%.0f KiB", float64(r.searched["manager metrics"])/(1<<10))
	row("manager's sockets to PostgreSQL + blackholes, peak (/proc)\t%d", r.bounds.sockets)
	row("  to PostgreSQL, peak\t%d", r.bounds.socketsPG)
	row("  to blackholes (dials that hang), peak\t%d", r.bounds.socketsHole)
	row("(sockets: %d samples, 200 ms apart; %d failed)\t", r.bounds.socketSamples, r.bounds.socketFailures)
	row("connections open at the blackholes, exact peak\t%d", r.blackholePeak)
	row("operator sessions in pg_stat_activity at the end\t%d", r.poolConnsAfter)
	row("load average of the machine at the start / at the end\t%s / %s", r.loadBefore, r.loadAfter)
	row("blackholes whose message names the connection bound, at the end\t%d of %d", r.final.slotBound, mix[kindBlackhole])
	row("status writes (PATCH outboxrelays/status) in %s once settled\t%.0f", r.steady, r.statusPatches)
	row("status writes per relay per check interval (%s)\t%.2f", r.interval, r.writesPerInterval)
	for k, kw := range r.writesByKind {
		if mix[k] == 0 {
			continue
		}
		row("  %s: per relay per interval / most of one relay in %s\t%.2f / %d", relayKind(k),
			r.steady, float64(kw.total)/float64(mix[k])/(r.steady.Seconds()/r.interval.Seconds()), kw.maxPerRelay)
	}
	for _, p := range []string{"manager", "kube-apiserver", "etcd"} {
		row("CPU time of %s until settled\t%.1f s", p, r.cpu[p].Seconds())
	}
	searched := 0
	for _, size := range r.searched {
		searched += size
	}
	row("canaries found (log, metrics, relays' spec and status, Deployments, CronJobs, Events: %.1f MiB)\t%d",
		float64(searched)/(1<<20), len(r.leaks))
	for _, line := range r.requests {
		row("API requests %s", line)
	}
	_ = w.Flush()
}

// check asserts what the benchmark promises, after the figures are printed.
func (r hostileResult) check(b *testing.B, mix hostileMix) {
	require.Empty(b, r.leaks, "a canary password leaked")
	require.Equal(b, mix, r.final.done, "relays without their final condition at the end: %v", r.final.others)
	require.Positive(b, r.bounds.scrapes, "the prober's gauges were never scraped")
	require.Positive(b, r.bounds.socketSamples, "the manager's sockets were never counted")
	g := r.bounds.gauges
	require.Positive(b, g["checks_max"])
	require.Positive(b, g["connections_max"])
	require.LessOrEqual(b, g["checks_running"], g["checks_max"], "backlog checks above their bound")
	require.LessOrEqual(b, g["connections_open"], g["connections_max"], "backlog connections above their bound")
	require.LessOrEqual(b, float64(r.bounds.sockets), g["connections_max"], "the manager's sockets above the bound on connections")
	require.Positive(b, g["dials_max"])
	require.LessOrEqual(b, g["dials_running"], g["dials_max"], "backlog checks connecting above their bound")
	require.LessOrEqual(b, g["connections_dialing"], g["dials_max"], "backlog dials above their bound")
	// A socket to a blackhole is a dial that waits (the connection is
	// closed when its connect timeout ends, before the dial slot is given
	// back): never more than the dial slots.
	require.LessOrEqual(b, float64(r.bounds.socketsHole), g["dials_max"], "the manager's sockets to blackholes above the bound on dials")
	// Not the blackholes' own count: it runs behind the hang-ups it has yet
	// to read.
	// A window of k intervals holds at most k+1 writes of a relay written
	// at most once per interval.
	most := int(r.steady/r.interval) + 1
	for k, kw := range r.writesByKind {
		require.LessOrEqual(b, kw.maxPerRelay, most, "status writes of one %s relay in %s", relayKind(k), r.steady)
	}
}
