package doctor

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Defaults of Monitor.
const (
	DefaultMonitorInterval = 5 * time.Minute
	DefaultMonitorTimeout  = 10 * time.Second
)

// Gauge values of outbox_relay_redis_check.
const (
	GaugeOK   = 0 // ok or info
	GaugeWarn = 1 // a risk, or unknown
	GaugeFail = 2
)

// NewGauge returns the gauge outbox_relay_redis_check{check}: per
// durability check ("connection", "role", "eviction", "persistence"), 0 when
// ok, 1 on a warning (including "unknown": the check could not be made), 2
// on a failure. Alert on `outbox_relay_redis_check == 2`.
func NewGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outbox_relay_redis_check",
		Help: "Redis durability checks of the relay: 0 ok, 1 warning or unknown, 2 failure (see relay doctor).",
	}, []string{"check"})
}

// gaugeValue maps a status to the gauge.
func gaugeValue(s Status) float64 {
	switch s {
	case Warn:
		return GaugeWarn
	case Fail:
		return GaugeFail
	}
	return GaugeOK
}

// Monitor runs the Redis durability checks at start and every Interval,
// logs each check that warns or fails (with its fix) and sets the gauge. It
// never stops the relay: a person decides.
type Monitor struct {
	// Client is the relay's Redis client (required).
	Client redis.UniversalClient
	// Target names the stream, whose node is checked in a cluster.
	Target RedisTarget
	// Interval between runs (default 5m); Timeout bounds one (default 10s).
	Interval, Timeout time.Duration
	// Logger receives the warnings (default slog.Default()).
	Logger *slog.Logger
	// Gauge is set per check; nil sets none.
	Gauge *prometheus.GaugeVec
}

// Run checks until ctx is done.
func (m *Monitor) Run(ctx context.Context) {
	interval := cmp.Or(m.Interval, DefaultMonitorInterval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		m.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce runs the checks once, logs and exports them, and returns them.
func (m *Monitor) RunOnce(ctx context.Context) Report {
	log := m.Logger
	if log == nil {
		log = slog.Default()
	}
	cctx, cancel := context.WithTimeout(ctx, cmp.Or(m.Timeout, DefaultMonitorTimeout))
	defer cancel()
	r := DurabilityChecks(GatherRedis(cctx, m.Client, m.Target))
	if ctx.Err() != nil {
		return r // shutting down: the failure is ours
	}
	for _, c := range r {
		if m.Gauge != nil {
			m.Gauge.WithLabelValues(gaugeName(c.Name)).Set(gaugeValue(c.Status))
		}
		if c.Status == Warn || c.Status == Fail {
			log.Warn("Redis durability check did not pass", "check", c.Name, "status", string(c.Status),
				"reason", c.Reason, "message", c.Message, "fix", c.Fix)
		}
	}
	return r
}

// gaugeName is the check's name without its "redis." prefix.
func gaugeName(name string) string {
	const prefix = "redis."
	if len(name) > len(prefix) && name[:len(prefix)] == prefix {
		return name[len(prefix):]
	}
	return name
}
