package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func (b *testBundle) streamLen(t *testing.T) int64 {
	t.Helper()
	n, err := b.rdb.XLen(context.Background(), b.stream).Result()
	if err != nil {
		return -1 // Redis may be down in fault tests
	}
	return n
}

// waitFor polls cond until it holds, failing after 60s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, testenv.True(cond))
}

func testutilCounter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// newTestLogger logs text at debug level to w.
func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
