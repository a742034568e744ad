package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// keyColumn is the key column the PerKey rows use; every mode's rows carry
// it (keyCount keys, round robin), so that the modes drain the same rows.
const (
	keyColumn = "aggregate_id"
	keyCount  = 1000
)

// modeConfig is one row of the ordering table: an --ordering value and the
// relay processes running it (for Strict, one active and the rest standbys).
type modeConfig struct {
	ordering relay.Ordering
	relays   int
}

func (m modeConfig) String() string { return fmt.Sprintf("%s:%d", m.ordering, m.relays) }

// args are the relay flags of the mode.
func (m modeConfig) args() []string {
	args := []string{"--ordering=" + string(m.ordering)}
	if m.ordering == relay.OrderingPerKey {
		args = append(args, "--key-column="+keyColumn)
	}
	return args
}

// owners is how many relays own key partitions once settled, and how many
// partitions there are (0: not an ordered mode).
func (m modeConfig) owners() (relays, partitions int) {
	switch m.ordering {
	case relay.OrderingStrict:
		return 1, 1
	case relay.OrderingPerKey:
		return min(m.relays, relay.DefaultPartitions), relay.DefaultPartitions // the relay's default --partitions
	}
	return 0, 0
}

// parseModes parses "None:1,Strict:2,PerKey:4" (an ordering, ':' and the
// relay count; the count defaults to 1).
func parseModes(s string) ([]modeConfig, error) {
	var out []modeConfig
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		name, count, _ := strings.Cut(strings.TrimSpace(f), ":")
		m := modeConfig{ordering: relay.Ordering(name), relays: 1}
		if count != "" {
			n, err := strconv.Atoi(count)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("mode %q: the relay count must be a positive integer", f)
			}
			m.relays = n
		}
		if !slices.Contains([]relay.Ordering{relay.OrderingNone, relay.OrderingStrict, relay.OrderingPerKey}, m.ordering) {
			return nil, fmt.Errorf("mode %q: the ordering must be None, Strict or PerKey", f)
		}
		out = append(out, m)
	}
	return out, nil
}

type modeResult struct {
	mode    modeConfig
	batch   int
	rate    float64 // events/s draining the rows, first to last XADD (median)
	runs    []float64
	rssMiB  float64
	latency latencyResult
}

// ensureKeyColumn adds the key column the PerKey rows need.
func (e *benchEnv) ensureKeyColumn(ctx context.Context) error {
	_, err := e.db.Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS `+keyColumn+` text`)
	return err
}

// settle waits until the mode's relays own their key partitions: every
// owner holds its share of the partitions' locks (session-level advisory
// locks in exclusive mode), the same on two looks 300 ms apart.
func (e *benchEnv) settle(ctx context.Context, m modeConfig) error {
	owners, partitions := m.owners()
	if partitions == 0 {
		time.Sleep(time.Second) // let the relays connect
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	last := ""
	for {
		rows, err := e.db.Query(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
			GROUP BY pid ORDER BY 1`)
		if err != nil {
			return err
		}
		var held []int
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return err
			}
			held = append(held, n)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		sum := 0
		for _, n := range held {
			sum += n
		}
		share := (partitions + owners - 1) / owners
		now := fmt.Sprint(held)
		if len(held) == owners && sum == partitions && held[len(held)-1] <= share {
			if now == last {
				return nil
			}
			last = now
		} else {
			last = ""
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the relays did not settle their key partitions within a minute (held %v)", m, held)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// modeThroughput starts the mode's relays on an empty table, waits until
// they own their partitions, then commits n keyed rows in one statement and
// measures events/s from the first to the last XADD.
func (e *benchEnv) modeThroughput(ctx context.Context, m modeConfig, n, batch int) (rate, rssMiB float64, err error) {
	if err := e.load(ctx, 0); err != nil {
		return 0, 0, err
	}
	if err := e.rdb.Del(ctx, stream+":fence").Err(); err != nil {
		return 0, 0, err
	}
	relays, err := e.startRelays(m.relays, append(m.args(), "--batch-size="+strconv.Itoa(batch))...)
	if err != nil {
		return 0, 0, err
	}
	defer stopAll(relays)
	if err := e.settle(ctx, m); err != nil {
		return 0, 0, err
	}
	_, err = e.db.Exec(ctx, `INSERT INTO outbox_events (id, event_type, payload, created_at, `+keyColumn+`)
		SELECT gen_random_uuid(), 'order_created', `+payloadSQL+`, now() - interval '1 hour' + g * interval '1 microsecond',
			'agg-' || (g % $2)
		FROM generate_series(1, $1) g`, n, keyCount)
	if err != nil {
		return 0, 0, fmt.Errorf("loading %d rows: %w", n, err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		l, err := e.rdb.XLen(ctx, stream).Result()
		if err != nil {
			return 0, 0, err
		}
		if l >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("%s: only %d of %d events published after 5 minutes", m, l, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, r := range relays {
		rssMiB = max(rssMiB, peakRSSMiB(r.Process.Pid))
	}
	first, err := e.rdb.XRangeN(ctx, stream, "-", "+", 1).Result()
	if err != nil {
		return 0, 0, err
	}
	last, err := e.rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil {
		return 0, 0, err
	}
	ms := entryMillis(last[0].ID) - entryMillis(first[0].ID) + 1
	return float64(n) / (float64(ms) / 1000), rssMiB, nil
}

// runModes measures each mode: throughput (median of repeat runs) and
// latency with polling alone.
func (e *benchEnv) runModes(ctx context.Context, o options, modes []modeConfig) ([]modeResult, error) {
	if err := e.ensureKeyColumn(ctx); err != nil {
		return nil, err
	}
	const batch = 500
	var out []modeResult
	for _, m := range modes {
		res := modeResult{mode: m, batch: batch}
		for range o.repeat {
			rate, rss, err := e.modeThroughput(ctx, m, o.rows, batch)
			if err != nil {
				return nil, err
			}
			res.runs = append(res.runs, rate)
			res.rssMiB = max(res.rssMiB, rss)
		}
		res.rate = medianOf(res.runs)
		logf("mode %s, batch %d: %.0f events/s (runs %.0f)", m, batch, res.rate, res.runs)
		lat, err := e.latencyWith(ctx, o.rate, o.duration, latencyOptions{mode: &m})
		if err != nil {
			return nil, err
		}
		res.latency = lat
		logf("mode %s, %d events/s offered: p50 %s p99 %s", m, o.rate, lat.p50, lat.p99)
		out = append(out, res)
	}
	return out, nil
}

// modeLabel names a mode row for the table.
func modeLabel(m modeConfig) string {
	switch m.ordering {
	case relay.OrderingStrict:
		if m.relays > 1 {
			return fmt.Sprintf("Strict, 1 active + %d standby", m.relays-1)
		}
		return "Strict, 1 relay"
	case relay.OrderingPerKey:
		return fmt.Sprintf("PerKey, %d relay(s), %d keys", m.relays, keyCount)
	}
	return fmt.Sprintf("None, %d relay(s)", m.relays)
}
