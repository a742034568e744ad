package logical

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestDecodedEventsAreTheTextTheClaimReads: an event from the stream has the
// id, type and payload a relay's own session reads from the row as text
// (id::text, the claim's, the catch-up's and the replay's), so that an
// event published twice, once from each (a catch-up beside the stream, a
// replay), has one event_id for consumers to dedupe on. pgoutput sends each
// column in its type's output text, which differs from ::text for char(n)
// (padded with spaces, which ::text strips) and follows the walsender's
// output settings, which a database or role may set: here bytea_output and
// DateStyle, on a bytea id (a binary UUID or ULID) and a char(n) event type,
// on an id of a domain over char(n), and on inet and boolean ids, whose casts
// to text are not their output functions either.
func TestDecodedEventsAreTheTextTheClaimReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, ddl, insert string }{
		{"bytea id, char type", `CREATE TABLE outbox_events (id bytea PRIMARY KEY, event_type char(20) NOT NULL,
			payload json NOT NULL, created_at timestamp NOT NULL DEFAULT now(), dispatched_at timestamp)`,
			`INSERT INTO outbox_events (id, event_type, payload) VALUES
				('\x01a2ff', 'order created', '{"a":  1.10, "é": "\u00e9"}'), ('\x02', '', '""')`},
		{"domain over char id", `CREATE DOMAIN ulid AS char(30);
			CREATE TABLE outbox_events (id ulid PRIMARY KEY, event_type varchar(20) NOT NULL,
			payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz)`,
			`INSERT INTO outbox_events (id, event_type, payload) VALUES ('01J  X', 'order_created ', ' p '), ('01K', 't', '')`},
		{"inet id", `CREATE TABLE outbox_events (id inet PRIMARY KEY, event_type text NOT NULL,
			payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz)`,
			`INSERT INTO outbox_events (id, event_type, payload) VALUES ('10.0.0.1', 't', '{"b":1, "a":2}'), ('::1', 't', '[]'),
				('10.0.0.0/8', 't', '1')`},
		{"boolean id", `CREATE TABLE outbox_events (id boolean PRIMARY KEY, event_type text NOT NULL,
			payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz)`,
			`INSERT INTO outbox_events (id, event_type, payload) VALUES (true, 't', 'p'), (false, 't', 'p')`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := testenv.Postgres(t)
			b := setup(t, dsn, "", outbox.Columns{}, `DO $$ BEGIN
				EXECUTE format('ALTER DATABASE %I SET bytea_output = %L', current_database(), 'escape');
				EXECUTE format('ALTER DATABASE %I SET DateStyle = %L', current_database(), 'SQL, DMY');
				EXECUTE format('ALTER DATABASE %I SET IntervalStyle = %L', current_database(), 'sql_standard');
			END $$;`+tc.ddl)
			r := b.open(t)
			_, err := b.db.Exec(b.ctx, tc.insert)
			require.NoError(t, err)
			var n int
			require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM outbox_events`).Scan(&n))
			events, _ := read(t, r, n, 10)

			cfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{}, 1)
			require.NoError(t, err)
			pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			// In insertion order, the stream's.
			rows, err := pool.Query(b.ctx, `SELECT id::text, event_type::text, payload::text FROM outbox_events ORDER BY ctid`)
			require.NoError(t, err)
			var want [][3]string
			for rows.Next() {
				var w [3]string
				require.NoError(t, rows.Scan(&w[0], &w[1], &w[2]))
				want = append(want, w)
			}
			require.NoError(t, rows.Err())
			got := make([][3]string, len(events))
			for i, e := range events {
				require.Empty(t, e.Malformed)
				got[i] = [3]string{e.ID, e.Type, e.Payload}
			}
			require.Equal(t, want, got)
		})
	}
}
