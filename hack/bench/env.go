package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// stream is the stream every run writes to; it is deleted between runs.
const stream = "bench"

// payloadSQL makes a JSON payload of about 200 bytes, the shape of the
// sample's order_created event.
const payloadSQL = `json_build_object(
	'order_id', gen_random_uuid(),
	'customer_email', 'customer' || g || '@example.com',
	'amount', '19.99',
	'currency', 'EUR',
	'note', repeat('x', 60))::text`

type benchEnv struct {
	dsn, redisURL, relayBin string
	db                      *pgxpool.Pool
	// claimDB is the raw claim's pool, its sessions set up as the relay's
	// are (SessionSettings.StablePlans and WarmAllocator), apart from the
	// sessions that load the rows: a session's history changes what a
	// claim costs on it (WarmAllocator).
	claimDB *pgxpool.Pool
	rdb     *redis.Client
	table   *outbox.Table
	// postmaster is the PostgreSQL server's pid, 0 if /proc does not show
	// it: its process tree's CPU time is the database's (pgCPU).
	postmaster int
	// redisPID is the Redis server's (INFO server), 0 if unknown.
	redisPID int
	// extraArgs are added to every relay started (the wait section).
	extraArgs []string
	// minSpread, when above 0, makes each throughput run wait (up to
	// spreadWait) until cpuSpread is at least this (-min-cpu-spread).
	minSpread float64
}

func newBenchEnv(ctx context.Context, dsn, redisURL, relayBin string) (*benchEnv, error) {
	table := outbox.MustNew("", outbox.Columns{})
	cfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{}, 8)
	if err != nil {
		return nil, err
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := db.Exec(ctx, table.DDL(outbox.DDLOptions{})); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating the outbox table: %w", err)
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		db.Close()
		return nil, err
	}
	var backend int
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		db.Close()
		return nil, err
	}
	postmaster := 0
	if st, ok := readStat(backend); ok {
		postmaster = st.ppid // a backend is a child of the postmaster
	}
	claimCfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{StablePlans: true, WarmAllocator: true}, 2)
	if err != nil {
		db.Close()
		return nil, err
	}
	claimDB, err := pgxpool.NewWithConfig(ctx, claimCfg) // connects lazily
	if err != nil {
		db.Close()
		return nil, err
	}
	rdb := redis.NewClient(opts)
	return &benchEnv{dsn: dsn, redisURL: redisURL, relayBin: relayBin, db: db, claimDB: claimDB, rdb: rdb, table: table,
		postmaster: postmaster, redisPID: redisPID(ctx, rdb)}, nil
}

// redisPID reads the server's process_id from INFO server; 0 if absent.
func redisPID(ctx context.Context, rdb *redis.Client) int {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			return pid
		}
	}
	return 0
}

func (e *benchEnv) close() {
	e.db.Close()
	e.claimDB.Close()
	_ = e.rdb.Close()
}

// load empties the table and the stream and inserts n pending rows.
func (e *benchEnv) load(ctx context.Context, n int) error {
	if _, err := e.db.Exec(ctx, `TRUNCATE outbox_events`); err != nil {
		return err
	}
	if err := e.rdb.Del(ctx, stream).Err(); err != nil {
		return err
	}
	// The deleted stream is a new one for the next relay, not a stream
	// reset of the last relay's: forget what the relays recorded of it, or
	// each run would begin by finding and recording a reset (a statement of
	// a quarter of a second on a table of 100,000 dispatched rows).
	for _, name := range []string{e.table.StreamStateTableName(), e.table.StreamResetsTableName()} {
		if _, err := e.db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
			IF to_regclass('%[1]s') IS NOT NULL THEN TRUNCATE %[1]s; END IF;
		END $$`, name)); err != nil {
			return fmt.Errorf("forgetting the last stream: %w", err)
		}
	}
	if n > 0 {
		_, err := e.db.Exec(ctx, `INSERT INTO outbox_events (id, event_type, payload, created_at)
			SELECT gen_random_uuid(), 'order_created', `+payloadSQL+`, now() - interval '1 hour' + g * interval '1 microsecond'
			FROM generate_series(1, $1) g`, n)
		if err != nil {
			return fmt.Errorf("loading %d rows: %w", n, err)
		}
	}
	_, err := e.db.Exec(ctx, `VACUUM ANALYZE outbox_events`)
	return err
}

type rawResult struct {
	conns, batch int
	rate         float64
}

// rawClaimRate drains n rows with the claim statement of cleanup mode d
// (mark or delete) and a commit per batch, on conns connections, without
// Redis: the ceiling PostgreSQL sets. Each connection claims as a relay's
// claimer does, from its frontier (outbox.Frontier).
func (e *benchEnv) rawClaimRate(ctx context.Context, n, batch, conns int, d outbox.Dispatch) (float64, error) {
	rate, _, err := e.rawClaim(ctx, n, batch, conns, d)
	return rate, err
}

// rawClaim is rawClaimRate, and PostgreSQL's CPU ms per 1,000 rows claimed
// (NaN: not measured), to compare with a relay run's.
func (e *benchEnv) rawClaim(ctx context.Context, n, batch, conns int, d outbox.Dispatch) (float64, float64, error) {
	if err := e.load(ctx, n); err != nil {
		return 0, math.NaN(), err
	}
	cpuBefore, cpuOK := e.pgCPU()
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	start := time.Now()
	for range conns {
		wg.Go(func() {
			var frontier outbox.Frontier // where the relay's claims begin, too
			for {
				tx, err := e.claimDB.Begin(outbox.ForClaims(ctx)) // as the relay's claims
				if err != nil {
					errs <- err
					return
				}
				events, err := e.table.ClaimNext(ctx, tx, d, outbox.Rows(batch), &frontier)
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					errs <- err
					return
				}
				if len(events) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := math.NaN()
	if cpuAfter, ok := e.pgCPU(); ok && cpuOK {
		cpu = float64(cpuAfter-cpuBefore) / float64(time.Millisecond) / (float64(n) / 1000)
	}
	close(errs)
	if err := <-errs; err != nil {
		return 0, cpu, fmt.Errorf("raw claim: %w", err)
	}
	return float64(n) / elapsed.Seconds(), cpu, nil
}

type throughputResult struct {
	batch, procs, inFlight int
	dispatch               outbox.Dispatch // the relays' --cleanup-mode
	rate                   float64         // events/s from the first to the last XADD
	rssMiB                 float64         // the largest peak RSS among the processes
	raw                    float64         // raw claim rate of the same mode, the mean of before and after (drain)
	ofRaw                  float64         // rate / raw
	pgCPUPer1k             float64         // PostgreSQL's CPU ms per 1,000 events drained; NaN: not measured
	rawPGCPUPer1k          float64         // PostgreSQL's CPU ms per 1,000 rows of the raw claims (their mean)
	redisCPUPer1k          float64         // Redis's, the same way
	relayCPUPer1k          float64         // the relay processes', from their start
	cpuSpread              float64         // cpuSpread before and after the run, the lower; of the median: the lowest of all runs
	runs                   []throughputResult
}

// median picks the run with the median rate; RSS is the largest of all
// runs, the raw rate, the fraction and the database's CPU their own medians.
func (t throughputResult) median() throughputResult {
	runs := slices.Clone(t.runs)
	slices.SortFunc(runs, func(a, b throughputResult) int { return cmp.Compare(a.rate, b.rate) })
	m := runs[len(runs)/2]
	raws := make([]float64, 0, len(runs))
	fractions := make([]float64, 0, len(runs))
	cpus := make([]float64, 0, len(runs))
	rawCPUs := make([]float64, 0, len(runs))
	redisCPUs := make([]float64, 0, len(runs))
	relayCPUs := make([]float64, 0, len(runs))
	for _, r := range runs {
		m.rssMiB = max(m.rssMiB, r.rssMiB)
		raws, fractions, cpus = append(raws, r.raw), append(fractions, r.ofRaw), append(cpus, r.pgCPUPer1k)
		redisCPUs, relayCPUs = append(redisCPUs, r.redisCPUPer1k), append(relayCPUs, r.relayCPUPer1k)
		rawCPUs = append(rawCPUs, r.rawPGCPUPer1k)
	}
	m.rawPGCPUPer1k = medianOf(rawCPUs)
	m.raw, m.ofRaw, m.pgCPUPer1k = medianOf(raws), medianOf(fractions), medianOf(cpus)
	m.redisCPUPer1k, m.relayCPUPer1k = medianOf(redisCPUs), medianOf(relayCPUs)
	m.cpuSpread = math.Inf(1)
	for _, r := range runs {
		m.cpuSpread = math.Min(m.cpuSpread, r.cpuSpread) // NaN stays NaN
	}
	m.runs = t.runs
	return m
}

// drains runs drain repeat times and returns the median.
func (e *benchEnv) drains(ctx context.Context, repeat, n, batch, procs, inFlight int, d outbox.Dispatch) (throughputResult, error) {
	var res throughputResult
	for range repeat {
		r, err := e.drain(ctx, n, batch, procs, inFlight, d)
		if err != nil {
			return res, err
		}
		res.runs = append(res.runs, r)
	}
	return res.median(), nil
}

// drain measures one configuration once: the raw claim rate of cleanup mode
// d on as many connections as relay processes, the relays draining as many
// rows, and the raw claim rate again. The fraction divides by the mean of
// the two raw rates, which bracket the relay run: on a machine whose speed
// drifts by 10 to 20% within minutes (a shared virtual machine), a raw rate
// from one side only makes the fraction drift with it.
func (e *benchEnv) drain(ctx context.Context, n, batch, procs, inFlight int, d outbox.Dispatch) (throughputResult, error) {
	spread := e.awaitEvenCPUs(ctx)
	before, beforeCPU, err := e.rawClaim(ctx, n, batch, procs, d)
	if err != nil {
		return throughputResult{}, err
	}
	r, err := e.throughput(ctx, n, batch, procs, inFlight, d)
	if err != nil {
		return r, err
	}
	after, afterCPU, err := e.rawClaim(ctx, n, batch, procs, d)
	if err != nil {
		return r, err
	}
	r.raw = (before + after) / 2
	r.rawPGCPUPer1k = (beforeCPU + afterCPU) / 2
	r.ofRaw = r.rate / r.raw
	r.cpuSpread = math.Min(spread, cpuSpread())
	return r, nil
}

// spreadWait bounds awaitEvenCPUs: past it the run goes on, and its
// reported spread shows why its figures may be low.
const spreadWait = 3 * time.Minute

// awaitEvenCPUs returns cpuSpread, after waiting for it to reach
// e.minSpread if that is set.
func (e *benchEnv) awaitEvenCPUs(ctx context.Context) float64 {
	deadline := time.Now().Add(spreadWait)
	for {
		spread := cpuSpread()
		if e.minSpread <= 0 || !(spread < e.minSpread) || time.Now().After(deadline) || ctx.Err() != nil {
			return spread
		}
		logf("vCPU speeds differ (slowest at %.2f of the fastest): waiting for them to even out", spread)
		time.Sleep(5 * time.Second)
	}
}

// cleanupArgs are the relay flags of cleanup mode d: none for the default.
func cleanupArgs(d outbox.Dispatch) []string {
	if d == outbox.MarkDispatched {
		return nil
	}
	return []string{"--cleanup-mode=" + d.String()}
}

// throughput loads n rows and drains them with procs relay processes in
// cleanup mode d.
func (e *benchEnv) throughput(ctx context.Context, n, batch, procs, inFlight int, d outbox.Dispatch) (throughputResult, error) {
	res := throughputResult{batch: batch, procs: procs, inFlight: inFlight, dispatch: d, pgCPUPer1k: math.NaN(),
		redisCPUPer1k: math.NaN(), relayCPUPer1k: math.NaN()}
	if err := e.load(ctx, n); err != nil {
		return res, err
	}
	cpuBefore, cpuOK := e.pgCPU()
	redisBefore, redisOK := readStat(e.redisPID)
	relays, err := e.startRelays(procs, append([]string{"--batch-size=" + strconv.Itoa(batch),
		"--in-flight=" + strconv.Itoa(inFlight)}, cleanupArgs(d)...)...)
	if err != nil {
		return res, err
	}
	defer stopAll(relays)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		l, err := e.rdb.XLen(ctx, stream).Result()
		if err != nil {
			return res, err
		}
		if l >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("only %d of %d events published after 5 minutes", l, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	per1k := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / (float64(n) / 1000) }
	if cpuAfter, ok := e.pgCPU(); ok && cpuOK {
		res.pgCPUPer1k = per1k(cpuAfter - cpuBefore)
	}
	if redisAfter, ok := readStat(e.redisPID); ok && redisOK {
		res.redisCPUPer1k = per1k(redisAfter.cpu - redisBefore.cpu)
	}
	var relayCPU time.Duration
	relayOK := true
	for _, r := range relays {
		st, ok := readStat(r.Process.Pid)
		relayCPU, relayOK = relayCPU+st.cpu, relayOK && ok
	}
	if relayOK {
		res.relayCPUPer1k = per1k(relayCPU)
	}
	for _, r := range relays {
		res.rssMiB = max(res.rssMiB, peakRSSMiB(r.Process.Pid))
	}
	first, err := e.rdb.XRangeN(ctx, stream, "-", "+", 1).Result()
	if err != nil {
		return res, err
	}
	last, err := e.rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil {
		return res, err
	}
	ms := entryMillis(last[0].ID) - entryMillis(first[0].ID) + 1
	res.rate = float64(n) / (float64(ms) / 1000)
	return res, nil
}

// clockTick is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100
// on every architecture Linux runs Go on.
const clockTick = 10 * time.Millisecond

// procStat is what pgCPU reads of /proc/<pid>/stat.
type procStat struct {
	ppid int
	cpu  time.Duration // utime+stime, and cutime+cstime: of the children waited for
}

// readStat reads /proc/<pid>/stat; false if the process is gone or hidden.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// The command, field 2, is in parentheses and may hold spaces; the
	// fields after it start with field 3 (state).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, false
	}
	st := procStat{}
	st.ppid, _ = strconv.Atoi(f[1]) // field 4
	for _, k := range f[11:15] {    // fields 14 to 17: utime, stime, cutime, cstime
		t, _ := strconv.ParseInt(k, 10, 64)
		st.cpu += time.Duration(t) * clockTick
	}
	return st, true
}

// pgCPU is the CPU time the PostgreSQL server has used so far: the
// postmaster's, its live children's (backends, WAL writer, checkpointer,
// autovacuum) and, through the postmaster's cutime and cstime, that of the
// children that have exited. The difference of two readings is the
// database's CPU between them; false if it cannot be read.
func (e *benchEnv) pgCPU() (time.Duration, bool) {
	if e.postmaster == 0 {
		return 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var total time.Duration
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == e.postmaster {
			continue
		}
		if st, ok := readStat(pid); ok && st.ppid == e.postmaster {
			total += st.cpu
		}
	}
	// Read last: a child that exits during the scan is then counted twice
	// at worst (live, and reaped), never missed. The relays' backends stay
	// open until the relays stop, after the reading.
	st, ok := readStat(e.postmaster)
	if !ok {
		return 0, false
	}
	return total + st.cpu, true
}

// entryMillis is the Redis time, in ms, at which an entry was added.
func entryMillis(id string) int64 {
	ms, _ := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
	return ms
}

// startRelays starts relay processes with their own ports for probes.
func (e *benchEnv) startRelays(n int, args ...string) ([]*exec.Cmd, error) {
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.Command(e.relayBin, append(append([]string{"run", "--stream=" + stream,
			"--metrics-bind-address=0", "--health-probe-bind-address=0", "--log-level=warn"}, e.extraArgs...), args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+e.dsn, "REDIS_URL="+e.redisURL)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			stopAll(cmds)
			return nil, fmt.Errorf("starting relay: %w", err)
		}
		cmds = append(cmds, cmd)
	}
	return cmds, nil
}

// stopAll sends SIGTERM and waits: the relay's own graceful stop.
func stopAll(cmds []*exec.Cmd) {
	for _, c := range cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range cmds {
		_ = c.Wait()
	}
}

// peakRSSMiB reads VmHWM, the peak resident set, of a live process.
func peakRSSMiB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}

type latencyResult struct {
	notify        bool
	offered       int
	achieved      float64
	events        int
	p50, p99, max time.Duration
	rssMiB        float64
	// pgCPUPer1k is PostgreSQL's CPU ms per 1,000 events offered, from the
	// first insert until the last event arrived: the producers' inserts and
	// the relays' work; NaN: not measured.
	pgCPUPer1k float64
}

// warmUp is the start of each latency run left out of the figures: the
// relay wakes from its idle poll interval into busy polling, and the figures
// are about the steady state.
const warmUp = time.Second

// latency offers rate events/s for d, one row per transaction, and measures
// from each commit's return to the entry's arrival at a blocking XREAD: the
// commit-to-XADD time plus Redis's delivery to the reader (sub-millisecond on
// loopback), so an upper bound of the relay's own latency.
func (e *benchEnv) latency(ctx context.Context, rate int, d time.Duration, notify bool) (latencyResult, error) {
	return e.latencyWith(ctx, rate, d, latencyOptions{notify: notify})
}

// latencyOptions vary a latency run: the NOTIFY trigger, and an ordering
// mode (its relays, flags and keyed rows) instead of one default relay.
type latencyOptions struct {
	notify bool
	mode   *modeConfig
	// relays is how many default relays run when mode is nil (0: one).
	relays int
	// dispatch is the relays' cleanup mode.
	dispatch outbox.Dispatch
	// source is where the relays read events (the zero value: polling).
	source source
	// producers is the pool the producers insert through (nil: e.db's).
	producers *pgxpool.Pool
}

// latencyWith is latency with options.
func (e *benchEnv) latencyWith(ctx context.Context, rate int, d time.Duration, opts latencyOptions) (res latencyResult, err error) {
	notify := opts.notify
	res = latencyResult{notify: notify, offered: rate, pgCPUPer1k: math.NaN()}
	if err := e.load(ctx, 0); err != nil {
		return res, err
	}
	if err := e.rdb.Del(ctx, stream+":fence").Err(); err != nil {
		return res, err
	}
	// load analyzed the empty table; with autovacuum off those statistics
	// stay stale for the whole run, as they do on a real outbox analyzed at
	// a quiet moment, so the run shows the claim's plan does not depend on
	// them (docs/relay.md).
	if _, err := e.db.Exec(ctx, `ALTER TABLE outbox_events SET (autovacuum_enabled = off)`); err != nil {
		return res, err
	}
	defer func() {
		_, _ = e.db.Exec(context.WithoutCancel(ctx), `ALTER TABLE outbox_events RESET (autovacuum_enabled)`)
	}()
	if _, err := e.db.Exec(ctx, e.table.DDL(outbox.DDLOptions{Notify: notify})); err != nil {
		return res, err
	}
	if !notify {
		if _, err := e.db.Exec(ctx, `DROP TRIGGER IF EXISTS `+pgx.Identifier{e.table.TriggerName()}.Sanitize()+` ON outbox_events`); err != nil {
			return res, err
		}
	}
	procs, args := cmp.Or(opts.relays, 1), []string(nil)
	insertSQL := `INSERT INTO outbox_events (event_type, payload)
					SELECT 'order_created', ` + payloadSQL + ` FROM (SELECT $1::int AS g) s RETURNING id::text`
	if opts.mode != nil {
		procs, args = opts.mode.relays, opts.mode.args()
		insertSQL = `INSERT INTO outbox_events (event_type, payload, ` + keyColumn + `)
					SELECT 'order_created', ` + payloadSQL + `, 'agg-' || (g % ` + strconv.Itoa(keyCount) + `)
					FROM (SELECT $1::int AS g) s RETURNING id::text`
	}
	relays, err := e.startRelays(procs, slices.Concat(args, cleanupArgs(opts.dispatch), opts.source.args())...)
	if err != nil {
		return res, err
	}
	defer func() {
		stopAll(relays)
		err = errors.Join(err, e.release(ctx, opts.source))
	}()
	if opts.mode != nil {
		if err := e.settle(ctx, *opts.mode); err != nil {
			return res, err
		}
	} else if err := e.ready(ctx, opts.source); err != nil {
		return res, err
	}

	producers := cmp.Or(opts.producers, e.db)
	var mu sync.Mutex
	committed := map[string]time.Time{}
	received := map[string]time.Time{}
	readCtx, stopReading := context.WithCancel(ctx)
	readerDone := make(chan error, 1)
	go func() { readerDone <- e.readStream(readCtx, &mu, received) }()

	// Open loop: each of `workers` producers owns every workers-th slot of a
	// fixed schedule, so a slow insert delays only its own next slot.
	const workers = 8
	interval := time.Second / time.Duration(rate)
	total := int((d + warmUp) / interval)
	skip := int(warmUp / interval)
	cpuBefore, cpuOK := e.pgCPU()
	start := time.Now().Add(100 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < total; i += workers {
				time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
				var id string
				err := producers.QueryRow(ctx, insertSQL, i).Scan(&id)
				if err != nil {
					errs <- err
					return
				}
				now := time.Now()
				if i >= skip {
					mu.Lock()
					committed[id] = now
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		stopReading()
		return res, fmt.Errorf("producer: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cpuAfter, ok := e.pgCPU(); ok && cpuOK {
		res.pgCPUPer1k = float64(cpuAfter-cpuBefore) / float64(time.Millisecond) / (float64(total) / 1000)
	}
	for _, r := range relays {
		res.rssMiB = max(res.rssMiB, peakRSSMiB(r.Process.Pid))
	}
	stopReading()
	if err := <-readerDone; err != nil && ctx.Err() == nil && readCtx.Err() == nil {
		return res, err
	}

	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		r, ok := received[id]
		if !ok {
			return res, fmt.Errorf("event %s committed but not received within 30s", id)
		}
		lat = append(lat, max(r.Sub(c), 0))
	}
	slices.Sort(lat)
	res.events = len(lat)
	res.achieved = float64(total) / elapsed.Seconds() // over the whole run, warm-up included
	res.p50 = lat[len(lat)*50/100]
	res.p99 = lat[len(lat)*99/100]
	res.max = lat[len(lat)-1]
	return res, nil
}

// readStream records when each event arrives, until ctx is cancelled.
func (e *benchEnv) readStream(ctx context.Context, mu *sync.Mutex, received map[string]time.Time) error {
	last := "$"
	for ctx.Err() == nil {
		streams, err := e.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: 200 * time.Millisecond, Count: 1000}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			if ctx.Err() != nil || isClosed(err) {
				return nil
			}
			return err
		}
		now := time.Now()
		mu.Lock()
		for _, s := range streams {
			for _, m := range s.Messages {
				received[m.Values["event_id"].(string)] = now
				last = m.ID
			}
		}
		mu.Unlock()
	}
	return nil
}

func isClosed(err error) bool {
	_, ok := err.(net.Error)
	return ok || err == context.Canceled
}
