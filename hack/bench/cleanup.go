package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// cleanupModes are the claims the cleanup section compares, the default first.
var cleanupModes = []outbox.Dispatch{outbox.MarkDispatched, outbox.DeleteOnDispatch}

// cleanupBatch is the batch size of the cleanup section (the relay's default).
const cleanupBatch = relay.DefaultBatchSize

// cleanupResult is one row of the cleanup table: the drains of one cleanup
// mode and process count (drain: the raw claim rate of that mode, then the
// relays), and the latency at the offered rate with as many relays.
type cleanupResult struct {
	drain   throughputResult
	latency latencyResult
	ofMark  float64 // events/s over the default mode's, same process count
}

// runCleanup measures, for each process count, both cleanup modes: repeat
// drains of each (the modes alternate, so that a change of the machine's
// load falls on both), then a latency run of each.
func (e *benchEnv) runCleanup(ctx context.Context, o options) ([]cleanupResult, error) {
	var out []cleanupResult
	for _, procs := range o.procs {
		runs := make([]throughputResult, len(cleanupModes))
		for range o.repeat {
			for i, d := range cleanupModes {
				r, err := e.drain(ctx, o.rows, cleanupBatch, procs, relay.DefaultInFlight, d)
				if err != nil {
					return nil, fmt.Errorf("cleanup mode %s, %d process(es): %w", d, procs, err)
				}
				runs[i].runs = append(runs[i].runs, r)
			}
		}
		var mark float64
		for i, d := range cleanupModes {
			res := cleanupResult{drain: runs[i].median()}
			if i == 0 {
				mark = res.drain.rate
			}
			res.ofMark = res.drain.rate / mark
			lat, err := e.latencyWith(ctx, o.rate, o.duration, latencyOptions{relays: procs, dispatch: d})
			if err != nil {
				return nil, fmt.Errorf("cleanup mode %s, %d process(es), latency: %w", d, procs, err)
			}
			res.latency = lat
			logf("cleanup mode %s, batch %d, %d process(es): %.0f events/s (%.0f%% of its raw %.0f rows/s, %.2fx the default), "+
				"p50 %s p99 %s at %d events/s, PG CPU %.1f ms per 1k events", d, cleanupBatch, procs, res.drain.rate,
				100*res.drain.ofRaw, res.drain.raw, res.ofMark, lat.p50, lat.p99, o.rate, res.drain.pgCPUPer1k)
			out = append(out, res)
		}
	}
	return out, nil
}

// cleanupLabel names a cleanup mode for the table.
func cleanupLabel(d outbox.Dispatch) string {
	if d == outbox.DeleteOnDispatch {
		return "OnDispatch (claim and delete)"
	}
	return "AfterRetention (claim and mark, default)"
}

func (r *report) printCleanup(b *strings.Builder) {
	fmt.Fprintf(b, "Cleanup modes (--cleanup-mode): events/s draining %d rows with `relay run` (batch %d, %d in flight, median\n"+
		"of runs, the modes alternating), against the raw claim rate of the same mode (PostgreSQL alone: that claim\n"+
		"statement + commit, no Redis, on as many connections as relays) measured right before and right after each\n"+
		"run (the mean); latency from commit to the stream at %d events/s offered, polling alone, after a %s warm-up;\n"+
		"PostgreSQL's CPU (postmaster and children, /proc) during the drain:\n\n", r.rows, cleanupBatch, relay.DefaultInFlight, r.rate, warmUp)
	fmt.Fprintln(b, "| mode | processes | events/s | runs | raw claim rate (rows/s) | of raw | vs default | "+
		"p50 | p99 | peak RSS (MiB) | PG CPU ms / 1k events |")
	fmt.Fprintln(b, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.cleanup {
		d := x.drain
		runs := make([]string, len(d.runs))
		for i, v := range d.runs {
			runs[i] = strconv.FormatFloat(v.rate, 'f', 0, 64)
		}
		cpu := "n/a"
		if !math.IsNaN(d.pgCPUPer1k) {
			cpu = strconv.FormatFloat(d.pgCPUPer1k, 'f', 1, 64)
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %s | %.0f | %.0f%% | %.2fx | %s | %s | %.1f | %s |\n", cleanupLabel(d.dispatch), d.procs,
			d.rate, strings.Join(runs, ", "), d.raw, 100*d.ofRaw, x.ofMark, ms(x.latency.p50), ms(x.latency.p99),
			max(d.rssMiB, x.latency.rssMiB), cpu)
	}
	fmt.Fprintln(b)
	// The ratio of the raw claim rates is the reference (#16:
	// claim and delete at 1.8 to 2.4 times claim and mark in pgbench).
	for i := 0; i+1 < len(r.cleanup); i += 2 {
		mark, del := r.cleanup[i].drain, r.cleanup[i+1].drain
		fmt.Fprintf(b, "Raw claim rate, claim and delete over claim and mark, %d connection(s): %.0f / %.0f = %.2fx; "+
			"relay: %.0f / %.0f = %.2fx.\n", mark.procs, del.raw, mark.raw, del.raw/mark.raw, del.rate, mark.rate, del.rate/mark.rate)
	}
	fmt.Fprintln(b)
}
