// Command bench measures the relay on this machine and prints a table:
//
//   - throughput: N rows of the default layout (about 200-byte JSON payloads)
//     drained by `relay run` processes, for several batch sizes and process
//     counts, as events/s and as a fraction of the raw claim rate;
//   - the raw claim rate: PostgreSQL alone claiming and marking batches (the
//     claim statement and a commit, no Redis), measured in the same run;
//   - latency: under a steady offered load from a producer, the time from the
//     commit of an outbox row to its arrival in the stream, p50/p99/max, with
//     polling alone and with the NOTIFY trigger;
//   - the relay's peak RSS;
//   - the ordering modes (--ordering) and the cost of --wait-replicas;
//   - the cleanup modes: the default claim-and-mark against --cleanup-mode
//     OnDispatch's claim-and-delete, each beside the raw claim rate of its
//     own claim, with latency and PostgreSQL's CPU per 1,000 events;
//   - the sources: producers writing as fast as they can with one polling
//     relay, then with one relay on a logical replication slot (--source
//     LogicalReplication), the events/s each keeps up with, and the latency
//     of each at the offered load.
//
// It starts a throwaway PostgreSQL and Redis (internal/testenv) and builds
// the relay from this repository. Run it with `make bench`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

type options struct {
	rows       int
	batchSizes []int
	procs      []int
	inFlight   []int
	rate       int
	duration   time.Duration
	repeat     int
	minSpread  float64 // -min-cpu-spread
	chart      string
	relayBin   string
	sections   map[string]bool
	modes      []modeConfig
	producers  int
	rowsPerTx  []int
}

// sectionNames are the parts of the benchmark, in the order they run.
var sectionNames = []string{"raw", "throughput", "latency", "modes", "wait", "cleanup", "replication"}

func main() {
	var o options
	var batches, procs, inFlight, sections, modes, rowsPerTx string
	flag.IntVar(&o.rows, "rows", 100_000, "rows drained per throughput run")
	flag.StringVar(&batches, "batch-sizes", "100,500,1000", "batch sizes to measure")
	flag.StringVar(&procs, "procs", "1,2", "relay process counts to measure")
	flag.StringVar(&inFlight, "in-flight", "1,2", "values of relay --in-flight to measure")
	flag.IntVar(&o.rate, "rate", 2000, "offered load of the latency runs, events/s")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each latency run, and of the replication section's sustained window")
	flag.IntVar(&o.repeat, "repeat", 3, "runs per configuration; the median is reported")
	flag.Float64Var(&o.minSpread, "min-cpu-spread", 0,
		"throughput and cleanup runs wait (up to 3 minutes) until the slowest vCPU runs a fixed loop at least this fraction "+
			"as fast as the fastest (0.9: within 10%); 0: no wait, the spread is only reported")
	flag.StringVar(&o.chart, "chart", "docs/benchmarks-relay.png", "PNG chart to write; empty: none")
	flag.StringVar(&o.relayBin, "relay", "", "relay binary (default: built from ./cmd/relay)")
	flag.StringVar(&sections, "sections", strings.Join(sectionNames, ","),
		"parts to run: raw (claim rate), throughput (the batch/process matrix), latency, modes (the ordering modes), "+
			"wait (--wait-replicas 0 and 1 against a replica), cleanup (--cleanup-mode AfterRetention and OnDispatch), "+
			"replication (--source LogicalReplication against polling, with producers writing as fast as they can)")
	flag.IntVar(&o.producers, "producers", 8, "replication section: producers writing as fast as they can")
	flag.StringVar(&rowsPerTx, "rows-per-tx", "100,1", "replication section: rows per producer transaction, each measured")
	flag.StringVar(&modes, "modes", "None:1,Strict:2,PerKey:1,PerKey:4",
		"ordering modes to measure, each ordering:relays (Strict:2 is one active relay and one standby)")
	flag.Parse()
	var err error
	o.sections = map[string]bool{}
	for _, s := range strings.Split(sections, ",") {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(sectionNames, s) {
			err = fmt.Errorf("-sections: unknown section %q (known: %s)", s, strings.Join(sectionNames, ","))
		}
		o.sections[s] = true
	}
	if err == nil {
		o.modes, err = parseModes(modes)
	}
	if err == nil {
		o.batchSizes, err = ints(batches)
	}
	if err == nil {
		o.procs, err = ints(procs)
	}
	if err == nil {
		o.inFlight, err = ints(inFlight)
	}
	if err == nil {
		o.rowsPerTx, err = ints(rowsPerTx)
	}
	if err == nil && o.producers < 1 {
		err = fmt.Errorf("-producers: %d is not a positive integer", o.producers)
	}
	if err == nil {
		err = run(context.Background(), o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, o options) (err error) {
	tmp, err := os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // best effort
	if o.relayBin == "" {
		o.relayBin = filepath.Join(tmp, "relay")
		logf("building relay")
		build := exec.Command("go", "build", "-o", o.relayBin, "./cmd/relay")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building relay: %w", err)
		}
	}

	logf("starting PostgreSQL and Redis")
	pg, err := testenv.LaunchPostgres()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pg.Close()) }()
	rs, err := testenv.LaunchRedis()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rs.Close()) }()

	env, err := newBenchEnv(ctx, pg.DSN(), rs.URL(), o.relayBin)
	if err != nil {
		return err
	}
	defer env.close()
	env.minSpread = o.minSpread

	var report report
	report.machine = machine()
	report.rows = o.rows
	for _, conns := range []int{1, 2} {
		if !o.sections["raw"] {
			break
		}
		rate, err := median(o.repeat, func() (float64, error) {
			return env.rawClaimRate(ctx, o.rows, 500, conns, outbox.MarkDispatched)
		})
		if err != nil {
			return err
		}
		report.raw = append(report.raw, rawResult{conns: conns, batch: 500, rate: rate})
		logf("raw claim, batch 500, %d connection(s): %.0f rows/s", conns, rate)
	}
	for _, inFlight := range o.inFlight {
		if !o.sections["throughput"] {
			break
		}
		for _, batch := range o.batchSizes {
			for _, procs := range o.procs {
				res, err := env.drains(ctx, o.repeat, o.rows, batch, procs, inFlight, outbox.MarkDispatched)
				if err != nil {
					return err
				}
				report.throughput = append(report.throughput, res)
				logf("relay, batch %d, %d process(es), %d in flight: %.0f events/s (%.0f%% of raw), peak RSS %.1f MiB, "+
					"CPU ms per 1k events: PostgreSQL %.1f (%.1f in the raw claim), Redis %.1f, relays %.1f, vCPU spread %.2f",
					batch, procs, inFlight, res.rate, 100*res.ofRaw, res.rssMiB, res.pgCPUPer1k, res.rawPGCPUPer1k, res.redisCPUPer1k,
					res.relayCPUPer1k, res.cpuSpread)
			}
		}
	}
	for _, notify := range []bool{false, true} {
		if !o.sections["latency"] {
			break
		}
		res, err := env.latency(ctx, o.rate, o.duration, notify)
		if err != nil {
			return err
		}
		report.latency = append(report.latency, res)
		logf("latency, %d events/s offered, notify=%t: p50 %s p99 %s", o.rate, notify, res.p50, res.p99)
	}
	if o.sections["modes"] {
		if report.modes, err = env.runModes(ctx, o, o.modes); err != nil {
			return err
		}
		report.rate = o.rate
	}
	if o.sections["wait"] {
		if report.wait, err = env.runWait(ctx, o, rs.Port()); err != nil {
			return err
		}
		report.rate = o.rate
	}
	if o.sections["cleanup"] {
		if report.cleanup, err = env.runCleanup(ctx, o); err != nil {
			return err
		}
		report.rate = o.rate
	}
	if o.sections["replication"] {
		if report.replication, err = env.runReplication(ctx, o); err != nil {
			return err
		}
		report.rate = o.rate
	}
	if err := report.print(os.Stdout); err != nil {
		return err
	}
	if o.chart != "" && len(report.throughput) > 0 {
		if err := report.chart(o.chart); err != nil {
			return err
		}
		logf("wrote %s", o.chart)
	}
	return nil
}

// median runs f n times and returns the median result.
func median(n int, f func() (float64, error)) (float64, error) {
	var xs []float64
	for range n {
		x, err := f()
		if err != nil {
			return 0, err
		}
		xs = append(xs, x)
	}
	return medianOf(xs), nil
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// machine describes where the figures come from.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				model = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
		if len(f) >= 2 {
			if kb, err := strconv.Atoi(f[1]); err == nil {
				mem = fmt.Sprintf(", %d GiB RAM", (kb+512*1024)/(1024*1024))
			}
		}
	}
	pgv := "PostgreSQL"
	if out, err := exec.Command("sh", "-c", "postgres --version 2>/dev/null || ls /usr/lib/postgresql").Output(); err == nil {
		pgv = strings.TrimSpace(string(out))
	}
	rv := "Redis"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) >= 3 {
			rv = "Redis " + strings.TrimPrefix(f[2], "v=")
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s, %s, %s, %s", model, runtime.NumCPU(), mem, runtime.Version(), pgv, rv,
		time.Now().UTC().Format("2006-01-02"))
}
