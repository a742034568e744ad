package relay

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// BenchmarkDrain drains a filled outbox with the whole pipeline against the
// real servers and reports where a batch's time goes: the mean of each
// phase of outbox_relay_batch_phase_seconds per batch (claim, queued,
// publish, commit, in ms), beside events/s. With one batch in flight the
// phases add up to the batch; with more, a batch's claim overlaps the
// previous one's publish and commit, and "queued" is how long a claimed
// batch waits for the publisher. allocs/event counts the process's heap
// allocations while the relay drains. Run with
// go test ./internal/relay/ -run '^$' -bench BenchmarkDrain -benchtime 3x.
func BenchmarkDrain(b *testing.B) {
	const rows, batch = 20000, 500
	for _, inFlight := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("batch=%d/inflight=%d", batch, inFlight), func(b *testing.B) {
			bundle := setup(b, bundleOpts{})
			sums := map[string]float64{}
			var batches float64
			var drained time.Duration
			var mallocs uint64
			for b.Loop() {
				b.StopTimer()
				bundle.insertBulk(b, rows)
				r := bundle.newRelay(b, Config{BatchSize: batch, InFlight: inFlight})
				b.StartTimer()
				start := time.Now()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				stop := runInBackground(b, r)
				// The relay's own counter, not a count of the table: a query
				// in a loop would take PostgreSQL's time from the claims.
				for testutilCounter(r.cfg.Metrics.EventsPublished) < rows {
					time.Sleep(time.Millisecond)
				}
				drained += time.Since(start)
				b.StopTimer()
				runtime.ReadMemStats(&after)
				mallocs += after.Mallocs - before.Mallocs
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				for _, p := range batchPhases {
					s, n := histogramSum(b, r.cfg.Metrics.BatchPhase.WithLabelValues(p))
					sums[p] += s
					if p == PhaseClaim {
						batches += n
					}
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*rows)/drained.Seconds(), "events/s")
			// The whole process's heap allocations while the relay drained
			// (claim, decode, publish, commit, metrics), per event.
			b.ReportMetric(float64(mallocs)/float64(b.N*rows), "allocs/event")
			for _, p := range batchPhases {
				b.ReportMetric(sums[p]/batches*1000, p+"-ms/batch")
			}
		})
	}
}

// histogramSum reads a histogram's sum and count.
func histogramSum(b *testing.B, o prometheus.Observer) (sum, count float64) {
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		b.Fatal(err)
	}
	return m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
}
