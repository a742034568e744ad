package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/netdial"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// newRedisClient builds the client of REDIS_URL: one server (redis://,
// rediss://, unix://), a sentinel set (redis-sentinel://, rediss-sentinel://)
// or a cluster (redis-cluster://, rediss-cluster://); see internal/redisconn.
// caFile verifies the servers of a TLS URL. The client does not retry on its
// own: a retried pipeline would add entries twice, and the relay's loop
// already retries whole batches with backoff. Reads and writes are bounded
// by the publish timeout (and each call's deadline), the dial by at most
// 5 s, and the socket by the same keepalives and user timeout as the
// PostgreSQL link.
func newRedisClient(url, caFile string, publishTimeout time.Duration, tcp netdial.TCP) (redis.UniversalClient, error) {
	t, err := redisconn.Parse(url)
	if err != nil {
		// redisconn never echoes the URL.
		return nil, fmt.Errorf("parsing %s: %w", envRedisURL, err)
	}
	rdb, err := t.Client(redisconn.Options{
		CAFile:       caFile,
		DialTimeout:  min(publishTimeout, 5*time.Second),
		ReadTimeout:  publishTimeout,
		WriteTimeout: publishTimeout,
		PoolSize:     4,
		TCP:          tcp,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envRedisURL, err)
	}
	return rdb, nil
}

// startRedisMonitor runs the Redis durability checks of `relay doctor` at
// start and every --redis-check-interval, in the background, until ctx is
// done: a failing check is a warning in the log and the gauge
// outbox_relay_redis_check, never a reason to stop relaying.
func startRedisMonitor(ctx context.Context, o *runOptions, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger) {
	if o.redisCheckInterval == 0 {
		return
	}
	gauge := doctor.NewGauge()
	if err := reg.Register(gauge); err != nil {
		log.Error("Could not register the Redis check gauge", "error", err.Error())
		gauge = nil
	}
	m := &doctor.Monitor{
		Client:   rdb,
		Target:   doctor.RedisTarget{Stream: o.stream},
		Interval: o.redisCheckInterval,
		Timeout:  max(o.publishTimeout, 5*time.Second),
		Logger:   log,
		Gauge:    gauge,
	}
	go m.Run(ctx)
}
