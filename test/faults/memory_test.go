//go:build faults

package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestLargePayloadsStayWithinTheBudget: 240 MiB of outbox rows (120
// payloads of 2 MiB) behind a relay of batch size 500, its batch byte
// budget 8 MiB. The relay's peak resident memory stays under 128 MiB, the
// sample's container limit (before the budget it claimed every row at once:
// more than 240 MiB, an OOM kill and a crash loop on the same rows), and
// every event reaches the stream, in order. For source LogicalReplication
// half the rows are read by the catch-up, half from the slot. It runs in
// the CI slice too: a few seconds.
func TestLargePayloadsStayWithinTheBudget(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"Polling", "LogicalReplication"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			testLargePayloads(t, source)
		})
	}
}

func testLargePayloads(t *testing.T, source string) {
	const (
		rows      = 120
		payload   = 2 << 20
		budget    = 8 << 20
		limitMiB  = 128
		batchSize = 500
	)
	c := startOutboxCase(t)
	env, stream, rdb, conn := c.env, c.stream, c.rdb, c.conn
	insert := func(from, to int) {
		mustExec(t, conn, `INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 'big', '"' || g || repeat('x', $3::int) || '"', now() - interval '1 hour' + g * interval '1 ms'
			FROM generate_series($1::int, $2::int) g`, from, to, payload)
	}

	args := []string{"--stream", stream, "--batch-size", strconv.Itoa(batchSize), "--batch-bytes", strconv.Itoa(budget)}
	if source == "LogicalReplication" {
		args = append(args, "--source", "LogicalReplication", "--slot", "faults_large")
	}
	insert(1, rows/2)
	r := startRelay(t, "A", env, args...)
	insert(rows/2+1, rows)

	start := time.Now()
	eventually(t, 3*time.Minute, "every event in the stream", func() error {
		n, err := rdb.XLen(t.Context(), stream).Result()
		if err != nil || n < rows {
			return fmt.Errorf("%d of %d entries (%v)", n, rows, err)
		}
		return nil
	})
	took := time.Since(start)
	peak := peakRSSMiB(t, r.pid())

	want := idsByCreatedAt(t, conn)
	got := streamEventIDs(t, rdb, stream, 10)
	var first []string
	seen := map[string]bool{}
	for _, id := range got {
		if !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	require.Equal(t, want, first, "every event, in created_at order (first occurrences)")
	t.Logf("%s: %d events of %d MiB, batch size %d, --batch-bytes %d MiB: peak RSS %.1f MiB, drained in %s, %d entries",
		source, rows, payload>>20, batchSize, budget>>20, peak, took.Round(time.Millisecond), len(got))
	require.Less(t, peak, float64(limitMiB), "the relay's peak resident memory")
	if source == "Polling" {
		require.Len(t, got, rows, "one relay, no fault: each event once")
		require.GreaterOrEqual(t, r.metric("outbox_relay_batches_total"), float64(rows/4),
			"at most four rows of 2 MiB to a batch of 8 MiB")
	}
}

// idsByCreatedAt lists the table's ids in created_at order.
func idsByCreatedAt(t testing.TB, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT id::text FROM outbox_events ORDER BY created_at, id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// vmHWM is the peak resident set line of /proc/<pid>/status.
var vmHWM = regexp.MustCompile(`(?m)^VmHWM:\s+(\d+) kB$`)

// peakRSSMiB reads the peak resident memory of a live process.
func peakRSSMiB(t testing.TB, pid int) float64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	m := vmHWM.FindSubmatch(status)
	require.NotNil(t, m, "no VmHWM in /proc/%d/status", pid)
	kb, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	return float64(kb) / 1024
}

// TestParkedLargePayloadsAreRetriedWithinTheBudget: 160 MiB of parked rows
// (40 payloads of just under 4 MiB, which a person parked by a
// --max-payload-bytes too small and now retries with the default) and one
// payload of 64 MiB, over the limit. `relay dead-letters retry --all
// --batch-bytes 8MiB` publishes the 40, in the order they were parked, and
// leaves the large one parked with its reason, its peak resident memory
// under 128 MiB: it reads no payload over the limit (reading that one alone
// would pass 128 MiB), and pages of two of the others (before
// the budget it read the whole page of up to 100 rows with their payloads:
// 227 MiB here, gigabytes for a page of large ones).
func TestParkedLargePayloadsAreRetriedWithinTheBudget(t *testing.T) {
	t.Parallel()
	const (
		rows     = 40
		payload  = 4<<20 - 64 // two, with their ids, fit in the budget
		large    = 64 << 20
		budget   = 8 << 20
		limitMiB = 128
	)
	c := startOutboxCase(t)
	env, stream, rdb, conn := c.env, c.stream, c.rdb, c.conn
	park := func(from, to int) {
		mustExec(t, conn, `INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, created_at, stream, reason)
			SELECT g::text, 'big', g || repeat('x', $1::int), now(), $2, 'parked by the test'
			FROM generate_series($3::int, $4::int) g`, payload, stream, from, to)
	}
	park(1, rows/2)
	mustExec(t, conn, `INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, created_at, stream, reason)
		VALUES ('huge', 'big', repeat('y', $1::int), now(), $2, 'parked by the test')`, large, stream)
	park(rows/2+1, rows)

	out, stderr, peak, err := relayCommandPeak(t.Context(), env, "dead-letters", "retry", "--all",
		"--batch-bytes", strconv.Itoa(budget), "--output", "json")
	require.Error(t, err, "the payload over the limit stays parked: exit status 1")
	require.Contains(t, stderr, "1 parked rows still cannot be published")
	var res struct {
		Republished []int64 `json:"republished"`
		Refused     []struct {
			Reason string `json:"reason"`
		} `json:"refused"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	t.Logf("%d parked payloads of %d bytes and one of %d MiB, --batch-bytes %d MiB: peak RSS %.1f MiB",
		rows, payload, large>>20, budget>>20, peak)

	require.Len(t, res.Republished, rows)
	require.Len(t, res.Refused, 1)
	require.Contains(t, res.Refused[0].Reason, fmt.Sprintf("payload of %d bytes exceeds the limit", large))
	want := make([]string, rows)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	require.Equal(t, want, streamEventIDs(t, rdb, stream, 10), "each parked row once, in the order parked")
	left := listDeadLetters(t, env)
	require.Len(t, left, 1)
	require.Equal(t, "huge", *left[0].EventID)
	require.Less(t, peak, float64(limitMiB), "the retry's peak resident memory")
}
