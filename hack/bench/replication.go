package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// source is where the relays of a run read events: by polling the table
// (the zero value) or from a logical replication slot.
type source struct {
	slot string // the replication slot; "" for polling
}

// logicalSource is the replication section's slot; it is dropped after
// every run, so that no slot keeps WAL between runs.
var logicalSource = source{slot: "bench"}

func (s source) String() string {
	if s.slot == "" {
		return string(relay.SourcePolling)
	}
	return string(relay.SourceLogicalReplication)
}

// args are the relay flags of the source: none for polling.
func (s source) args() []string {
	if s.slot == "" {
		return nil
	}
	return []string{"--source=" + string(relay.SourceLogicalReplication), "--slot=" + s.slot}
}

// ready waits until relays just started on source s take events: a second
// to connect (and LISTEN) for polling; for a slot, until a walsender streams
// from it and the relay recorded its catch-up done (the table is empty at
// the start of every run, so the catch-up publishes nothing).
func (e *benchEnv) ready(ctx context.Context, s source) error {
	if s.slot == "" {
		time.Sleep(time.Second)
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := logical.Status(ctx, e.db, s.slot)
		if err != nil {
			return err
		}
		if st.Active {
			// The relay creates the progress table before the slot.
			p, ok, err := e.table.ReadProgress(ctx, e.db, s.slot)
			if err != nil {
				return err
			}
			if ok && !p.CatchUpPending {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s: the relay was not streaming within 30s (slot exists %t, active %t)",
				s.slot, st.Exists, st.Active)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// release drops the slot of source s once its relays have stopped: a slot
// left behind keeps WAL.
func (e *benchEnv) release(ctx context.Context, s source) error {
	if s.slot == "" {
		return nil
	}
	return logical.DropSlot(context.WithoutCancel(ctx), e.db, s.slot)
}

// Timings of the sustained runs: the producers' warm-up left out of the
// figures (the relay leaves its idle poll interval, the stream and the
// buffers fill), and how long the relay may take to publish the backlog
// once the producers stop.
const (
	sustainWarmUp   = 2 * time.Second
	sustainDrainMax = time.Minute
)

// sustainedResult is one row of the sustained table: producers writing as
// fast as they can for a window, with one relay of a source, or none.
type sustainedResult struct {
	src       source
	relay     bool // false: the producers alone, the reference of the database's CPU
	rowsPerTx int
	producers int
	window    time.Duration
	committed float64 // rows/s the producers committed over the window
	delivered float64 // stream entries/s over the window (XLEN deltas)
	// ceiling is what the relay could reach: the raw claim rate, measured
	// right before, for polling; the producers' commit rate for a slot.
	ceiling float64
	// backlog is the rows committed minus the stream's length when the
	// producers stopped; drained how long the relay took to publish it
	// (negative: not within sustainDrainMax).
	backlog int64
	drained time.Duration
	rssMiB  float64
	// pgCPUPer1k is PostgreSQL's CPU ms over the window per 1,000 rows
	// committed in it: the producers' inserts and the relay's reads (and,
	// polling, its marks); NaN: not measured.
	pgCPUPer1k float64
	// relayCPUPer1k is the relay's share, per 1,000 events delivered: the
	// window's CPU less the producers-alone run's per row committed; NaN:
	// not measured, or no reference.
	relayCPUPer1k float64
	windowCPU     time.Duration
	windowRows    int64 // rows committed in the window
	windowEvents  int64 // events delivered in the window
}

// sourceLatency is one row of the replication latency table.
type sourceLatency struct {
	src source
	// syncCommit: the producers committed with synchronous_commit on, as
	// the sustained runs do; otherwise with the test server's off.
	syncCommit bool
	latencyResult
}

type replicationResult struct {
	sustained []sustainedResult
	latency   []sourceLatency
}

// runReplication measures polling against the slot: for each transaction
// size, the producers alone, then with one polling relay (the raw claim rate
// measured right before), then with one relay on the slot; then the latency
// of each source at the offered rate. Each configuration runs once: a
// sustained figure is already the mean over its window.
func (e *benchEnv) runReplication(ctx context.Context, o options) (*replicationResult, error) {
	// The latency runs' producers are eight (latencyWith), the sustained
	// runs' o.producers.
	cfg, err := outbox.PoolConfig(e.dsn, outbox.SessionSettings{}, int32(max(o.producers, 8)))
	if err != nil {
		return nil, err
	}
	// PostgreSQL's default, which the test server turns off: a walsender
	// streams WAL only once it is flushed, and with synchronous_commit off
	// the WAL writer flushes it up to wal_writer_delay (200 ms) after the
	// commit returned. Polling sees a row as soon as it is committed.
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	producers, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer producers.Close()
	var out replicationResult
	for _, rowsPerTx := range o.rowsPerTx {
		var alone sustainedResult
		for _, run := range []struct {
			relay bool
			src   source
		}{{false, source{}}, {true, source{}}, {true, logicalSource}} {
			raw := math.NaN()
			if run.relay && run.src.slot == "" {
				if raw, err = e.rawClaimRate(ctx, o.rows, relay.DefaultBatchSize, 1, outbox.MarkDispatched); err != nil {
					return nil, err
				}
			}
			res, err := e.sustained(ctx, producers, run.src, run.relay, o.producers, rowsPerTx, o.duration)
			if err != nil {
				return nil, fmt.Errorf("sustained, %s, %d rows per transaction: %w", run.src, rowsPerTx, err)
			}
			switch {
			case !run.relay:
				alone = res
			case run.src.slot == "":
				res.ceiling = raw
			default:
				res.ceiling = res.committed
			}
			if run.relay && alone.windowRows > 0 && !math.IsNaN(res.pgCPUPer1k) && !math.IsNaN(alone.pgCPUPer1k) && res.windowEvents > 0 {
				inserts := float64(alone.windowCPU) / float64(alone.windowRows) * float64(res.windowRows)
				res.relayCPUPer1k = (float64(res.windowCPU) - inserts) / float64(time.Millisecond) / (float64(res.windowEvents) / 1000)
			}
			logf("sustained, %s, %d producers x %d rows/tx: committed %.0f rows/s, delivered %.0f events/s, "+
				"backlog %d, PG CPU %.1f ms per 1k rows", sustainedLabel(res), o.producers, rowsPerTx, res.committed,
				res.delivered, res.backlog, res.pgCPUPer1k)
			out.sustained = append(out.sustained, res)
		}
	}
	for _, run := range []struct {
		src        source
		syncCommit bool
	}{{source{}, true}, {logicalSource, true}, {logicalSource, false}} {
		opts := latencyOptions{source: run.src}
		if run.syncCommit {
			opts.producers = producers
		}
		lat, err := e.latencyWith(ctx, o.rate, o.duration, opts)
		if err != nil {
			return nil, fmt.Errorf("latency, %s: %w", run.src, err)
		}
		logf("latency, %s, synchronous_commit %s, %d events/s offered: p50 %s p99 %s", run.src, onOff(run.syncCommit),
			o.rate, lat.p50, lat.p99)
		out.latency = append(out.latency, sourceLatency{src: run.src, syncCommit: run.syncCommit, latencyResult: lat})
	}
	return &out, nil
}

// sustained runs n producers on pool db, each committing transactions of
// rowsPerTx rows as fast as it can, for sustainWarmUp and then window, with
// one relay of source src (none when withRelay is false), and measures the
// window: rows committed and stream entries added per second, and the
// database's CPU. Then it stops the producers and waits for the relay to
// publish the backlog.
func (e *benchEnv) sustained(ctx context.Context, db *pgxpool.Pool, src source, withRelay bool, n, rowsPerTx int,
	window time.Duration) (res sustainedResult, err error) {
	res = sustainedResult{src: src, relay: withRelay, rowsPerTx: rowsPerTx, producers: n, window: window,
		ceiling: math.NaN(), pgCPUPer1k: math.NaN(), relayCPUPer1k: math.NaN(), drained: -1}
	if err := e.load(ctx, 0); err != nil {
		return res, err
	}
	var relays []*exec.Cmd
	if withRelay {
		if relays, err = e.startRelays(1, src.args()...); err != nil {
			return res, err
		}
		defer func() {
			stopAll(relays)
			err = errors.Join(err, e.release(ctx, src))
		}()
		if err := e.ready(ctx, src); err != nil {
			return res, err
		}
	}

	insertSQL := `INSERT INTO outbox_events (event_type, payload)
		SELECT 'order_created', ` + payloadSQL + ` FROM generate_series(1, $1::int) g`
	var committed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for !stop.Load() {
				if _, err := db.Exec(ctx, insertSQL, rowsPerTx); err != nil {
					errs <- err
					stop.Store(true)
					return
				}
				committed.Add(int64(rowsPerTx))
			}
		})
	}
	type reading struct {
		at        time.Time
		committed int64
		length    int64
		cpu       time.Duration
		cpuOK     bool
	}
	read := func() (reading, error) {
		r := reading{at: time.Now(), committed: committed.Load()}
		if withRelay {
			l, err := e.rdb.XLen(ctx, stream).Result()
			if err != nil {
				return r, err
			}
			r.length = l
		}
		r.cpu, r.cpuOK = e.pgCPU()
		return r, nil
	}
	time.Sleep(sustainWarmUp)
	first, err := read()
	if err == nil {
		time.Sleep(window)
	}
	var last reading
	if err == nil {
		last, err = read()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	if perr := <-errs; perr != nil {
		return res, fmt.Errorf("producer: %w", perr)
	}
	if err != nil {
		return res, err
	}
	secs := last.at.Sub(first.at).Seconds()
	res.windowRows, res.windowEvents = last.committed-first.committed, last.length-first.length
	res.committed, res.delivered = float64(res.windowRows)/secs, float64(res.windowEvents)/secs
	if first.cpuOK && last.cpuOK && res.windowRows > 0 {
		res.windowCPU = last.cpu - first.cpu
		res.pgCPUPer1k = float64(res.windowCPU) / float64(time.Millisecond) / (float64(res.windowRows) / 1000)
	}
	if !withRelay {
		return res, nil
	}
	total := committed.Load()
	stopped := time.Now()
	for {
		l, err := e.rdb.XLen(ctx, stream).Result()
		if err != nil {
			return res, err
		}
		if res.backlog == 0 && l < total {
			res.backlog = total - l
		}
		if l >= total {
			if l > total {
				return res, fmt.Errorf("%d entries in the stream for %d rows committed", l, total)
			}
			res.drained = time.Since(stopped)
			res.rssMiB = peakRSSMiB(relays[0].Process.Pid)
			return res, nil
		}
		if time.Since(stopped) > sustainDrainMax {
			res.rssMiB = peakRSSMiB(relays[0].Process.Pid)
			return res, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sustainedLabel names a sustained row.
func sustainedLabel(x sustainedResult) string {
	if !x.relay {
		return "producers alone (no relay)"
	}
	return x.src.String()
}

func (r *report) printReplication(b *strings.Builder) {
	x := r.replication
	if len(x.sustained) > 0 {
		s := x.sustained[0]
		fmt.Fprintf(b, "Source LogicalReplication against polling, sustained: %d producers each committing transactions of\n"+
			"N rows (N per row below) as fast as they can, for %s after a %s warm-up, with one relay of default flags\n"+
			"(one run each); events/s are stream entries added over the window (XLEN), the producers' rows/s the rows\n"+
			"committed over it. The ceiling is the raw claim rate (batch %d, one connection, measured right before)\n"+
			"for polling, the producers' commit rate for the slot. The backlog is the rows committed minus the stream's\n"+
			"length when the producers stopped, then the time the relay took to publish it, and at what rate.\n"+
			"PostgreSQL's CPU (postmaster and children, /proc: the walsender included) over the window per 1,000 rows\n"+
			"committed; the relay's share per 1,000 events delivered is that less the producers-alone run's CPU per row\n"+
			"committed. The producers commit with synchronous_commit on (PostgreSQL's default; the test server's\n"+
			"is off, with fsync off). There is no drain of a pre-loaded table for the slot: a new slot's relay publishes\n"+
			"such rows by its catch-up, a read of the table, not from the stream:\n\n",
			s.producers, s.window, sustainWarmUp, relay.DefaultBatchSize)
		fmt.Fprintln(b, "| source | rows/tx | committed rows/s | delivered events/s | ceiling | of ceiling | backlog at stop | "+
			"published in | at events/s | peak RSS (MiB) | PG CPU ms / 1k rows | relay's PG CPU ms / 1k events |")
		fmt.Fprintln(b, "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, s := range x.sustained {
			if !s.relay {
				fmt.Fprintf(b, "| %s | %d | %.0f | | | | | | | | %s | |\n", sustainedLabel(s), s.rowsPerTx, s.committed,
					orNA(s.pgCPUPer1k))
				continue
			}
			kind := "raw claim"
			if s.src.slot != "" {
				kind = "committed"
			}
			drained, after := "over "+sustainDrainMax.String(), ""
			if s.drained >= 0 {
				drained = ms(s.drained)
				if s.backlog > 0 {
					after = strconv.FormatFloat(float64(s.backlog)/s.drained.Seconds(), 'f', 0, 64)
				}
			}
			fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.0f (%s) | %.0f%% | %d | %s | %s | %.1f | %s | %s |\n", sustainedLabel(s),
				s.rowsPerTx, s.committed, s.delivered, s.ceiling, kind, 100*s.delivered/s.ceiling, s.backlog, drained, after,
				s.rssMiB, orNA(s.pgCPUPer1k), orNA(s.relayCPUPer1k))
		}
		fmt.Fprintln(b)
	}
	if len(x.latency) > 0 {
		fmt.Fprintf(b, "Latency from commit to the stream at %d events/s offered (one row per transaction, open loop), one relay,\n"+
			"after a %s warm-up, the producers' synchronous_commit as given (a walsender streams only flushed WAL);\n"+
			"PostgreSQL's CPU per 1,000 events from the first insert to the last arrival (the producers' inserts included):\n\n",
			r.rate, warmUp)
		fmt.Fprintln(b, "| source | synchronous_commit | offered ev/s | achieved ev/s | events | p50 | p99 | max | "+
			"peak RSS (MiB) | PG CPU ms / 1k events |")
		fmt.Fprintln(b, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, l := range x.latency {
			fmt.Fprintf(b, "| %s | %s | %d | %.0f | %d | %s | %s | %s | %.1f | %s |\n", l.src, onOff(l.syncCommit), l.offered,
				l.achieved, l.events, ms(l.p50), ms(l.p99), ms(l.max), l.rssMiB, orNA(l.pgCPUPer1k))
		}
		fmt.Fprintln(b)
	}
	// The goals of issue #16, part 3.
	for i := 0; i+2 < len(x.sustained); i += 3 {
		poll, lr := x.sustained[i+1], x.sustained[i+2]
		ratio := lr.delivered / poll.delivered
		fmt.Fprintf(b, "Sustained, %d rows per transaction: LogicalReplication / Polling = %.0f / %.0f events/s = %.2fx "+
			"(goal: at least 2x): %s.\n", lr.rowsPerTx, lr.delivered, poll.delivered, ratio, metOrNot(ratio >= 2))
	}
	for _, l := range x.latency {
		if l.src.slot != "" {
			fmt.Fprintf(b, "LogicalReplication p99 at %d events/s, synchronous_commit %s: %s (goal: at most 10 ms): %s.\n",
				l.offered, onOff(l.syncCommit), ms(l.p99), metOrNot(l.p99 <= 10*time.Millisecond))
		}
	}
	fmt.Fprintln(b)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// orNA formats a CPU figure, n/a when not measured.
func orNA(x float64) string { return orNAPrec(x, 1) }

// orNA2 is orNA with two decimals.
func orNA2(x float64) string { return orNAPrec(x, 2) }

func orNAPrec(x float64, prec int) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}
