//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// outboxLayout is an outbox table split over several tables: its DDL
// (%[1]s is the table's name) and the tables producers insert into, with
// the created_at and event_type that route a row.
type outboxLayout struct {
	name    string
	ddl     string
	targets []insertTarget
}

type insertTarget struct {
	suffix    string // appended to the table's name: "" is the table itself
	createdAt string // SQL expression
	eventType string
}

// columns are the outbox columns every layout shares; the id comes from a
// sequence, since PostgreSQL 15 has no identity columns on partitioned tables.
const layoutColumns = `id bigint NOT NULL DEFAULT nextval('%[1]s_id'),
	event_type text NOT NULL,
	payload text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(),
	dispatched_at timestamptz NULL`

var outboxLayouts = []outboxLayout{
	{
		name: "range",
		ddl: `CREATE SEQUENCE %[1]s_id;
CREATE TABLE %[1]s (` + layoutColumns + `, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE %[1]s_old PARTITION OF %[1]s FOR VALUES FROM (MINVALUE) TO ('2001-01-01');
CREATE TABLE %[1]s_new PARTITION OF %[1]s FOR VALUES FROM ('2001-01-01') TO (MAXVALUE);
CREATE INDEX ON %[1]s (created_at) WHERE dispatched_at IS NULL;`,
		targets: []insertTarget{
			{createdAt: "now() - interval '30 years'", eventType: "old"},
			{createdAt: "now()", eventType: "new"},
		},
	},
	{
		name: "list",
		ddl: `CREATE SEQUENCE %[1]s_id;
CREATE TABLE %[1]s (` + layoutColumns + `, PRIMARY KEY (id, event_type)) PARTITION BY LIST (event_type);
CREATE TABLE %[1]s_a PARTITION OF %[1]s FOR VALUES IN ('a');
CREATE TABLE %[1]s_b PARTITION OF %[1]s FOR VALUES IN ('b');
CREATE INDEX ON %[1]s (created_at) WHERE dispatched_at IS NULL;`,
		targets: []insertTarget{
			{createdAt: "now()", eventType: "a"},
			{createdAt: "now()", eventType: "b"},
		},
	},
	{
		name: "hash",
		ddl: `CREATE SEQUENCE %[1]s_id;
CREATE TABLE %[1]s (` + layoutColumns + `, PRIMARY KEY (id)) PARTITION BY HASH (id);
CREATE TABLE %[1]s_h0 PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE %[1]s_h1 PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE INDEX ON %[1]s (created_at) WHERE dispatched_at IS NULL;`,
		// One target; the hash spreads its rows evenly over both partitions.
		targets: []insertTarget{{createdAt: "now()", eventType: "h"}, {createdAt: "now()", eventType: "h"}},
	},
	{
		name: "inherited",
		ddl: `CREATE SEQUENCE %[1]s_id;
CREATE TABLE %[1]s (` + layoutColumns + `, PRIMARY KEY (id));
CREATE TABLE %[1]s_c1 (PRIMARY KEY (id)) INHERITS (%[1]s);
CREATE TABLE %[1]s_c2 (PRIMARY KEY (id)) INHERITS (%[1]s);
CREATE INDEX ON %[1]s (created_at) WHERE dispatched_at IS NULL;
CREATE INDEX ON %[1]s_c1 (created_at) WHERE dispatched_at IS NULL;
CREATE INDEX ON %[1]s_c2 (created_at) WHERE dispatched_at IS NULL;`,
		targets: []insertTarget{
			{suffix: "", createdAt: "now()", eventType: "parent"},
			{suffix: "_c1", createdAt: "now()", eventType: "child"},
			{suffix: "_c2", createdAt: "now()", eventType: "child"},
		},
	},
}

// targetInsert is the producer statement of one target: $1 rows.
func targetInsert(table string, tg insertTarget) string {
	return fmt.Sprintf(`INSERT INTO %s%s (event_type, payload, created_at)
SELECT '%s', json_build_object('n', g)::text, %s FROM generate_series(1, $1) g
RETURNING id::text, created_at`, table, tg.suffix, tg.eventType, tg.createdAt)
}

// TestPartitions relays partitioned (range, list, hash) and inherited
// outbox tables whose parts hold the same number of rows, so that their
// ctids overlap, with two relays and `relay cleanup --retention 0s` in a
// loop: no pending row is deleted, and no row is claimed twice. In OnDispatch
// (FAULTS_SCALE=full) the claim's DELETE joins its rows back by (tableoid,
// ctid) too, and the cleanup loop has nothing to delete.
func TestPartitions(t *testing.T) {
	t.Parallel()
	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env := relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}
	forCleanupModesOnDispatchAtFull(t, func(t *testing.T, mode cleanupMode) {
		for _, l := range outboxLayouts {
			t.Run(l.name, func(t *testing.T) { testPartitioned(t, env, l, mode) })
		}
	})
}

func testPartitioned(t *testing.T, env relayEnv, l outboxLayout, mode cleanupMode) {
	perTarget := sized(1500, 8000)
	live := sized(2000, 10000)
	const batchSize = 50

	table, stream := testenv.Name(t), testenv.Name(t)
	conn := connect(t, env.databaseURL)
	mustExec(t, conn, fmt.Sprintf(l.ddl, table))
	var committed []Committed
	for _, tg := range l.targets {
		committed = append(committed, insertRows(t, conn, targetInsert(table, tg), perTarget)...)
	}

	args := append([]string{"--table", table, "--stream", stream, "--batch-size", strconv.Itoa(batchSize), "--in-flight", "2"},
		mode.args(t)...)
	a := startRelay(t, "A", env, args...)
	b := startRelay(t, "B", env, args...)
	cleanup := startCleanupLoop(t, env, table)
	prod := startProducers(t, producerConfig{
		dsn: env.databaseURL, conns: 3, events: live, rate: 1000,
		insert: func(rng *rand.Rand, n int) (string, []any) {
			return targetInsert(table, l.targets[rng.IntN(len(l.targets))]), []any{n}
		},
	})
	prod.wait(t)
	drain := waitDrained(t, conn, table, 5*time.Minute)
	deleted, runs := cleanup.stop(t)
	a.stop(t, time.Minute)
	b.stop(t, time.Minute)

	requireNothingLocked(t, conn, table)
	require.Zero(t, backlog(t, env, table).Count, "relay backlog")
	total := len(l.targets)*perTarget + live
	if mode == onDispatch {
		require.Zero(t, deleted, "relay cleanup deleted rows in OnDispatch, where no row is ever marked dispatched")
	}
	requireOutboxAfterDrain(t, conn, table, mode, total-deleted)
	r := checkStream(t, redisClient(t, env.redisURL), stream, append(committed, prod.committed()...))
	figures(t, r, 0, fmt.Sprintf("parts=%d cleanup_runs=%d cleanup_deleted=%d drain=%s", len(l.targets), runs, deleted, ms(drain)))
	require.Equal(t, total, r.Committed)
	require.Zero(t, r.Lost, "pending rows lost (deleted by cleanup, or never claimed), e.g. %v", r.LostIDs)
	require.Zero(t, r.Duplicates, "rows claimed twice without any fault, e.g. %v", r.DuplicateIDs)
	require.Zero(t, r.Unexpected)
}

// cleanupLoop runs `relay cleanup --retention 0s` again and again. It is
// never killed mid-run: a killed client's session would keep its DELETE
// running, and its row locks, until PostgreSQL noticed.
type cleanupLoop struct {
	stopping atomic.Bool
	done     chan struct{}
	deleted  int
	runs     int
	errs     []error
}

var deletedRE = regexp.MustCompile(`deleted (\d+) `)

func startCleanupLoop(t testing.TB, env relayEnv, table string) *cleanupLoop {
	t.Helper()
	c := &cleanupLoop{done: make(chan struct{})}
	t.Cleanup(func() { c.stopping.Store(true); <-c.done })
	go func() {
		defer close(c.done)
		for !c.stopping.Load() {
			out, _, err := relayCommand(context.Background(), env, "cleanup", "--table", table, "--retention", "0s", "--batch-size", "100")
			c.runs++
			if err != nil {
				c.errs = append(c.errs, err)
				continue
			}
			m := deletedRE.FindStringSubmatch(out)
			if m == nil {
				c.errs = append(c.errs, fmt.Errorf("relay cleanup printed %q", out))
				continue
			}
			n, _ := strconv.Atoi(m[1])
			c.deleted += n
		}
	}()
	return c
}

// stop ends the loop after the run in progress, requires that no run
// failed, and returns the rows deleted and the runs.
func (c *cleanupLoop) stop(t testing.TB) (deleted, runs int) {
	t.Helper()
	c.stopping.Store(true)
	<-c.done
	require.NoError(t, errors.Join(c.errs...), "relay cleanup")
	return c.deleted, c.runs
}
