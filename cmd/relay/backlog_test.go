package main

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// backlogJSON runs `relay backlog --output json` and parses its output, both
// into a map (to see which keys are there) and into the documented shape.
func backlogJSON(t *testing.T, env []string, args ...string) (map[string]any, int64, *time.Time) {
	t.Helper()
	res := requireSuccess(t, env, append([]string{"backlog"}, args...)...)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &raw), "backlog --output json: %q", res.stdout)
	var doc struct {
		Count  int64   `json:"count"`
		Oldest *string `json:"oldest"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &doc))
	if doc.Oldest == nil {
		return raw, doc.Count, nil
	}
	oldest, err := time.Parse(time.RFC3339, *doc.Oldest)
	require.NoError(t, err, "oldest must be RFC3339: %q", *doc.Oldest)
	return raw, doc.Count, &oldest
}

func TestBacklogEmpty(t *testing.T) {
	t.Parallel()
	dsn, _ := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn) // backlog needs no REDIS_URL

	res := requireSuccess(t, env, "backlog")
	require.Equal(t, "table:        outbox_events\n"+
		"backlog:      0\n"+
		"oldest:       none\n"+
		"dead letters: 0 (relay dead-letters list)\n", res.stdout)

	raw, count, oldest := backlogJSON(t, env, "--output", "json")
	require.Zero(t, count)
	require.Nil(t, oldest)
	require.Contains(t, raw, "oldest",
		`docs/relay-cli.md: {"count":N,"oldest":"RFC3339"|null,"deadLetters":N}; oldest is null when nothing is pending`)
	require.EqualValues(t, 0, raw["deadLetters"])
	require.Nil(t, raw["oldest"])
}

func TestBacklogCountsPendingRows(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	now := time.Now().Truncate(time.Microsecond)
	created := []time.Time{now.Add(-30 * time.Minute), now.Add(-2*time.Hour - 123456*time.Microsecond), now.Add(-time.Hour)}
	for _, c := range created {
		execSQL(t, db, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('a', '{}', $1)`, c)
	}
	// Dispatched rows do not count, however old.
	execSQL(t, db, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES ('a', '{}', $1, $2)`,
		now.Add(-5*time.Hour), now.Add(-4*time.Hour))
	want := created[1]

	raw, count, oldest := backlogJSON(t, env, "--output", "json")
	require.EqualValues(t, 3, count)
	require.EqualValues(t, 3, raw["count"])
	require.NotNil(t, oldest)
	require.True(t, want.Equal(*oldest), "oldest: want %s, got %s", want, oldest)

	_, count, oldest = backlogJSON(t, env, "-o", "json")
	require.EqualValues(t, 3, count)
	require.True(t, want.Equal(*oldest))

	res := requireSuccess(t, env, "backlog")
	require.Regexp(t, regexp.MustCompile(`^table:        outbox_events\nbacklog:      3\noldest:       `+
		regexp.QuoteMeta(want.UTC().Format(time.RFC3339))+` \(2h\d+m\d+s ago\)\ndead letters: 0 `), res.stdout)

	res = execRelay(t, env, "backlog", "--output", "yaml")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, `--output "yaml": must be text or json`)
	require.Empty(t, res.stdout)
}

func TestBacklogOfMissingTable(t *testing.T) {
	t.Parallel()
	dsn, _ := freshDB(t)
	res := execRelay(t, relayEnv("DATABASE_URL="+dsn), "backlog", "--table", "app.nowhere")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, "outbox table not found")
	require.Contains(t, res.stderr, "app.nowhere")
	require.Empty(t, res.stdout)
}
