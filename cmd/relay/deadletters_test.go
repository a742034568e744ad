package main

import (
	"encoding/json"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

type listedDeadLetter struct {
	ID           int64   `json:"id"`
	EventID      *string `json:"eventId"`
	EventType    *string `json:"eventType"`
	Stream       string  `json:"stream"`
	Reason       string  `json:"reason"`
	Attempts     int     `json:"attempts"`
	PayloadBytes *int64  `json:"payloadBytes"`
}

func listDeadLetters(t *testing.T, env []string, args ...string) []listedDeadLetter {
	t.Helper()
	res := requireSuccess(t, env, append([]string{"dead-letters", "list", "--output", "json"}, args...)...)
	var out []listedDeadLetter
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	return out
}

// TestDeadLettersParkedListedRetriedDiscarded runs the whole life of parked
// rows through the binary: a NULL payload and an oversized one are parked by
// `relay run`, listed, survive cleanup, stay parked on a retry before the
// cause is fixed, and are delivered once by a retry after it.
func TestDeadLettersParkedListedRetriedDiscarded(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	redisURL := testenv.Redis(t)
	rdb := redisClient(t, redisURL)
	stream := testenv.Name(t)
	env := relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL)
	execSQL(t, db, `ALTER TABLE outbox_events ALTER COLUMN payload DROP NOT NULL`)
	execSQL(t, db, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES
		('ok', '1', now() - interval '3 s'), ('null', NULL, now() - interval '2 s'), ('big', repeat('x', 4096), now() - interval '1 s')`)

	r := startRun(t, env, "--stream", stream, "--max-payload-bytes", "1024")
	waitUntil(t, r.relayProc, "the good row published and the others parked", func() bool {
		return streamLen(rdb, stream) == 1 && pending(t, db) == 0
	})
	r.signal(t, syscall.SIGTERM)
	require.Zero(t, r.wait(t, 30*time.Second))

	parked := listDeadLetters(t, env)
	require.Len(t, parked, 2)
	require.Equal(t, "null", *parked[0].EventType)
	require.Nil(t, parked[0].PayloadBytes)
	require.Contains(t, parked[0].Reason, "NULL in column payload")
	require.Equal(t, "big", *parked[1].EventType)
	require.EqualValues(t, 4096, *parked[1].PayloadBytes)
	require.Equal(t, stream, parked[1].Stream)
	text := requireSuccess(t, env, "dead-letters", "list")
	require.Contains(t, text.stdout, "exceeds the limit of 1024 bytes")
	res := requireSuccess(t, env, "backlog", "--output", "json")
	require.Contains(t, res.stdout, `"deadLetters":2`)

	// Cleanup deletes the dispatched outbox rows; the parked copies stay.
	requireSuccess(t, env, "cleanup", "--retention", "0s")
	require.Zero(t, queryInt(t, db, `SELECT count(*) FROM outbox_events`))
	require.Len(t, listDeadLetters(t, env), 2)

	// Selecting nothing is refused.
	res = execRelay(t, env, "dead-letters", "retry")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "--id, or --all")

	// A retry before the causes are fixed keeps both, counting the attempt.
	res = execRelay(t, env, "dead-letters", "retry", "--all", "--max-payload-bytes", "1024")
	require.Equal(t, 1, res.code, res.stderr)
	require.Contains(t, res.stderr, "2 parked rows still cannot be published")
	again := listDeadLetters(t, env)
	require.Len(t, again, 2)
	require.Equal(t, 2, again[0].Attempts)
	require.Contains(t, again[0].Reason, "set it with UPDATE, then retry")

	// Fix the causes: the parked copy's payload, and a larger limit.
	execSQL(t, db, `UPDATE outbox_events_dead_letters SET payload = '{"fixed":true}' WHERE event_type = 'null'`)
	res = requireSuccess(t, env, "dead-letters", "retry", "--id", strconv.FormatInt(parked[0].ID, 10), "--output", "json")
	require.Contains(t, res.stdout, `"republished":[`+strconv.FormatInt(parked[0].ID, 10)+`]`)
	requireSuccess(t, env, "dead-letters", "retry", "--all")
	require.Empty(t, listDeadLetters(t, env))

	entries := readStream(t, rdb, stream)
	require.Len(t, entries, 3, "the good row, then each parked row once")
	require.Equal(t, `{"fixed":true}`, entries[1]["payload"])
	require.Equal(t, *parked[0].EventID, entries[1]["event_id"])
	require.Len(t, entries[2]["payload"], 4096)
}

func TestDeadLettersDiscard(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	for i := range 3 {
		execSQL(t, db, `INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, stream, reason)
			VALUES ($1, 't', 'p', 's', 'test')`, strconv.Itoa(i))
	}
	res := requireSuccess(t, env, "dead-letters", "discard", "--id", "1,2")
	require.Contains(t, res.stdout, "discarded 2 parked rows [1 2]")
	left := listDeadLetters(t, env)
	require.Len(t, left, 1)
	require.EqualValues(t, 3, left[0].ID)
	require.Len(t, listDeadLetters(t, env, "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), 0)
	res = execRelay(t, env, "dead-letters", "list", "--since", "yesterday")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "not an RFC 3339 time")
}

func TestRunRefusesPublishTimeoutsBeyondTheIdleLimit(t *testing.T) {
	t.Parallel()
	res := execRelay(t, relayEnv("DATABASE_URL=postgres://x@127.0.0.1:1/x", "REDIS_URL=redis://127.0.0.1:1"),
		"run", "--publish-timeout", "30s", "--in-flight", "2", "--idle-in-transaction-timeout", "1m")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "--publish-timeout 30s x --in-flight 2 = 1m0s")
	require.Contains(t, res.stderr, "must stay below --idle-in-transaction-timeout 1m0s")
}

func TestRunRefusesAnUnknownOrdering(t *testing.T) {
	t.Parallel()
	res := execRelay(t, relayEnv("DATABASE_URL=postgres://x@127.0.0.1:1/x", "REDIS_URL=redis://127.0.0.1:1"),
		"run", "--ordering", "sideways")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, `--ordering: ordering "sideways": must be None, Strict or PerKey`)
}

func TestRunRefusesABadCleanupMode(t *testing.T) {
	t.Parallel()
	env := relayEnv("DATABASE_URL=postgres://x@127.0.0.1:1/x", "REDIS_URL=redis://127.0.0.1:1")
	res := execRelay(t, env, "run", "--cleanup-mode", "Never")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, `--cleanup-mode: cleanup mode "Never": must be AfterRetention or OnDispatch`)
	res = execRelay(t, env, "run", "--cleanup-mode", "OnDispatch", "--auto-replay")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "--auto-replay republishes dispatched rows, which --cleanup-mode OnDispatch deletes")
}

func TestRunRefusesABadSource(t *testing.T) {
	t.Parallel()
	env := relayEnv("DATABASE_URL=postgres://x@127.0.0.1:1/x", "REDIS_URL=redis://127.0.0.1:1")
	res := execRelay(t, env, "run", "--source", "Carrier")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, `--source: source "Carrier": must be Polling or LogicalReplication`)
	res = execRelay(t, env, "run", "--source", "LogicalReplication")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "--source LogicalReplication needs --slot")
	res = execRelay(t, env, "run", "--source", "LogicalReplication", "--slot", "Not-A-Slot")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "Not-A-Slot")
}
