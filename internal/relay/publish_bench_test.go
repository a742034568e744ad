package relay

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// BenchmarkPublish is the publish path of one batch of an unordered relay
// against a real Redis: the stream check, one XADD per event in one
// pipeline, the replies read. It reports the heap allocations per event
// (allocs/event) and the bytes per event beside Go's per-batch figures;
// docs/benchmarks.md has the figures. Run with
// go test ./internal/relay/ -run '^$' -bench BenchmarkPublish -benchmem.
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			bundle := setup(b, bundleOpts{})
			r := bundle.newRelay(b, Config{})
			events := make([]outbox.Event, size)
			for i := range events {
				events[i] = outbox.Event{ID: fmt.Sprintf("%08d-0000-0000-0000-000000000000", i), Type: "order_created",
					Payload: fmt.Sprintf(`{"order_id":"%08d","customer_email":"reader@example.com","amount":"12.99"}`, i)}
			}
			ctx := context.Background()
			if _, _, err := r.publish(ctx, events, nil, 0); err != nil { // the bulk limit read, the stream made
				b.Fatal(err)
			}
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for b.Loop() {
				if n, _, err := r.publish(ctx, events, nil, 0); err != nil || n != size {
					b.Fatalf("published %d of %d: %v", n, size, err)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			perEvent := float64(b.N * size)
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/perEvent, "allocs/event")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/perEvent, "B/event")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/perEvent, "ns/event")
			// The stream would grow by b.N batches: trim it between runs.
			_ = bundle.rdb.Del(ctx, bundle.stream).Err()
		})
	}
}
