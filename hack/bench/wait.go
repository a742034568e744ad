package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// waitResult is the cost of --wait-replicas: the same drain and the same
// latency run without and with WAIT for one replica.
type waitResult struct {
	replicas      int
	rate          float64
	runs          []float64
	p50, p99, max time.Duration
}

// runWait starts a replica of the benchmark's Redis and measures a drain of
// rows (batch 500, one relay) and the latency at rate, with --wait-replicas
// 0 and 1.
func (e *benchEnv) runWait(ctx context.Context, o options, primaryPort int) ([]waitResult, error) {
	replica, err := testenv.LaunchRedis(testenv.WithRedisArgs("--replicaof", "127.0.0.1", strconv.Itoa(primaryPort)))
	if err != nil {
		return nil, err
	}
	defer func() { _ = replica.Close() }()
	if err := waitForReplica(ctx, e.rdb); err != nil {
		return nil, err
	}
	var out []waitResult
	for _, n := range []int{0, 1} {
		e.extraArgs = []string{"--wait-replicas=" + strconv.Itoa(n)}
		res := waitResult{replicas: n}
		for range o.repeat {
			r, err := e.throughput(ctx, o.rows, 500, 1, 2, outbox.MarkDispatched)
			if err != nil {
				return nil, err
			}
			res.runs = append(res.runs, r.rate)
		}
		res.rate = medianOf(append([]float64(nil), res.runs...))
		lat, err := e.latency(ctx, o.rate, o.duration, false)
		if err != nil {
			return nil, err
		}
		res.p50, res.p99, res.max = lat.p50, lat.p99, lat.max
		out = append(out, res)
		logf("wait-replicas %d: %.0f events/s, p99 %s at %d events/s", n, res.rate, res.p99, o.rate)
	}
	e.extraArgs = nil
	return out, nil
}

// waitForReplica waits until the primary reports one connected replica in sync.
func waitForReplica(ctx context.Context, rdb *redis.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		info, err := rdb.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the replica did not come online within 30s")
}

func (r *report) printWait(b *strings.Builder) {
	fmt.Fprintf(b, "The cost of --wait-replicas (WAIT for a replica on loopback before each commit): events/s draining %d rows\n"+
		"(batch 500, one relay, 2 in flight, median of runs) and latency at %d events/s offered:\n\n", r.rows, r.rate)
	fmt.Fprintln(b, "| --wait-replicas | events/s | runs | p50 | p99 | max |")
	fmt.Fprintln(b, "| ---: | ---: | --- | ---: | ---: | ---: |")
	for _, x := range r.wait {
		runs := make([]string, len(x.runs))
		for i, v := range x.runs {
			runs[i] = strconv.FormatFloat(v, 'f', 0, 64)
		}
		fmt.Fprintf(b, "| %d | %.0f | %s | %s | %s | %s |\n", x.replicas, x.rate, strings.Join(runs, " / "), ms(x.p50), ms(x.p99), ms(x.max))
	}
	fmt.Fprintln(b)
}
