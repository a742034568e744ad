package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

type report struct {
	machine    string
	rows       int
	raw        []rawResult
	throughput []throughputResult
	latency    []latencyResult
	modes      []modeResult
	wait       []waitResult
	cleanup    []cleanupResult
	// replication is the sources' section; nil when not run.
	replication *replicationResult
	rate        int // offered load of the mode, wait, cleanup and replication latency runs
}

// print writes the report to w in one write: the tables are built in memory.
func (r *report) print(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nMachine: %s\n\n", r.machine)
	if len(r.raw) > 0 {
		r.printRaw(&b)
	}
	if len(r.throughput) > 0 {
		r.printThroughput(&b)
	}
	if len(r.latency) > 0 {
		r.printLatency(&b)
	}
	if len(r.wait) > 0 {
		r.printWait(&b)
	}
	if len(r.modes) > 0 {
		r.printModes(&b)
	}
	if len(r.cleanup) > 0 {
		r.printCleanup(&b)
	}
	if r.replication != nil {
		r.printReplication(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *report) printRaw(b *strings.Builder) {
	fmt.Fprintf(b, "Raw claim rate (PostgreSQL alone: claim statement + commit, no Redis), %d rows:\n\n", r.rows)
	fmt.Fprintln(b, "| connections | batch | rows/s |")
	fmt.Fprintln(b, "| ---: | ---: | ---: |")
	for _, x := range r.raw {
		fmt.Fprintf(b, "| %d | %d | %.0f |\n", x.conns, x.batch, x.rate)
	}
	fmt.Fprintln(b)
}

func (r *report) printModes(b *strings.Builder) {
	fmt.Fprintf(b, "Ordering modes: events/s draining %d rows committed at once (batch %d, median of runs, after the\n"+
		"relays settled their key partitions), and latency from commit to the stream at %d events/s offered, polling\n"+
		"alone, after a %s warm-up; rows keyed over %d keys:\n\n", r.rows, r.modes[0].batch, r.rate, warmUp, keyCount)
	fmt.Fprintln(b, "| mode | relays | events/s | runs | p50 | p99 | max | achieved ev/s | peak RSS (MiB) |")
	fmt.Fprintln(b, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.modes {
		runs := make([]string, len(x.runs))
		for i, v := range x.runs {
			runs[i] = strconv.FormatFloat(v, 'f', 0, 64)
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %s | %s | %s | %s | %.0f | %.1f |\n", modeLabel(x.mode), x.mode.relays, x.rate,
			strings.Join(runs, ", "), ms(x.latency.p50), ms(x.latency.p99), ms(x.latency.max), x.latency.achieved,
			max(x.rssMiB, x.latency.rssMiB))
	}
}

func (r *report) printThroughput(b *strings.Builder) {
	fmt.Fprintf(b, "Relay throughput, %d rows drained by `relay run` (median of runs; \"of raw\" compares with the raw claim rate\n"+
		"with the same batch size, on as many connections as relay processes, measured right before and right after\n"+
		"each run (the mean); CPU ms per 1,000 events from /proc: PostgreSQL's process tree, the Redis server, the\n"+
		"relay processes from their start, and PostgreSQL's in the raw claim runs (the mean); vCPU spread: the\n"+
		"slowest CPU's speed at a fixed loop as a fraction of the fastest's, measured before and after each run, the\n"+
		"lowest of the runs; below about 0.9 the fraction of the raw rate is low for the machine, not the relay):\n\n", r.rows)
	fmt.Fprintln(b, "| batch | processes | in flight | events/s | of raw claim rate | peak RSS (MiB) | "+
		"CPU ms / 1k: PostgreSQL | Redis | relays | PostgreSQL, raw claim | vCPU spread |")
	fmt.Fprintln(b, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.throughput {
		fmt.Fprintf(b, "| %d | %d | %d | %.0f | %.0f%% | %.1f | %s | %s | %s | %s | %s |\n", x.batch, x.procs, x.inFlight, x.rate,
			100*x.ofRaw, x.rssMiB, orNA(x.pgCPUPer1k), orNA(x.redisCPUPer1k), orNA(x.relayCPUPer1k), orNA(x.rawPGCPUPer1k),
			orNA2(x.cpuSpread))
	}
	fmt.Fprintln(b)
}

func (r *report) printLatency(b *strings.Builder) {
	fmt.Fprintf(b, "Latency from commit of the outbox row to the entry in the stream, one relay, default flags, "+
		"after a %s warm-up, on a table analyzed while empty and kept so (autovacuum off):\n", warmUp)
	fmt.Fprintln(b)
	fmt.Fprintln(b, "| wake-up | offered ev/s | achieved ev/s | events | p50 | p99 | max | peak RSS (MiB) |")
	fmt.Fprintln(b, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.latency {
		mode := "polling"
		if x.notify {
			mode = "NOTIFY trigger"
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %d | %s | %s | %s | %.1f |\n", mode, x.offered, x.achieved, x.events,
			ms(x.p50), ms(x.p99), ms(x.max), x.rssMiB)
	}
	fmt.Fprintln(b)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

// chart draws events/s per batch size, one bar group per process count, and
// the raw claim rate of one connection as a reference line; the cleanup
// section's OnDispatch relays add bars at its batch size (its default-mode
// runs are the throughput section's configuration again).
func (r *report) chart(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Relay throughput, %d rows (raw claim rate dashed)", r.rows)
	p.Y.Label.Text = "events/s"
	p.X.Label.Text = "batch size"
	var batches []int
	bySeries := map[string]map[int]float64{}
	var series []string
	results := slices.Clone(r.throughput)
	for _, x := range r.cleanup {
		if x.drain.dispatch == outbox.DeleteOnDispatch {
			results = append(results, x.drain)
		}
	}
	for _, x := range results {
		name := fmt.Sprintf("%d process(es), %d in flight", x.procs, x.inFlight)
		if x.dispatch == outbox.DeleteOnDispatch {
			name = "--cleanup-mode OnDispatch, " + name
		}
		if bySeries[name] == nil {
			bySeries[name] = map[int]float64{}
			series = append(series, name)
		}
		bySeries[name][x.batch] = x.rate
		if !contains(batches, x.batch) {
			batches = append(batches, x.batch)
		}
	}
	width := vg.Points(14)
	for i, name := range series {
		vals := make(plotter.Values, len(batches))
		for j, b := range batches {
			vals[j] = bySeries[name][b]
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(bars)
		p.Legend.Add(name, bars)
	}
	for i, raw := range r.raw {
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: raw.rate}, {X: float64(len(batches)) - 0.5, Y: raw.rate}})
		if err != nil {
			return err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		line.Color = plotutil.Color(len(series) + i)
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("raw claim and mark, %d connection(s)", raw.conns), line)
	}
	names := make([]string, len(batches))
	for i, b := range batches {
		names[i] = strconv.Itoa(b)
	}
	p.NominalX(names...)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Min = 0
	p.Y.Max *= 1.35 // room for the legend above the bars
	if len(results) > len(r.throughput) {
		p.Y.Max *= 1.15 // and for its OnDispatch entries
	}
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
