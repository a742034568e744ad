//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// insertFunc returns the statement of one producer transaction that inserts
// n rows and returns each one's id::text and created_at.
type insertFunc func(rng *rand.Rand, n int) (sql string, args []any)

// insertInto inserts n small JSON events into table, with the table's
// defaults for the id and created_at.
func insertInto(table string) insertFunc {
	sql := fmt.Sprintf(`INSERT INTO %s (event_type, payload)
SELECT 'fault.test', json_build_object('n', g, 'pad', repeat('x', 64))::text FROM generate_series(1, $1) g
RETURNING id::text, created_at`, pgx.Identifier{table}.Sanitize())
	return func(_ *rand.Rand, n int) (string, []any) { return sql, []any{n} }
}

// insertAheadSometimes inserts like insertInto, with created_at ahead of
// the server's clock by ahead in every other transaction, at random (a
// producer whose clock runs ahead, or which sets the time itself).
func insertAheadSometimes(table string, ahead time.Duration) insertFunc {
	sql := fmt.Sprintf(`INSERT INTO %s (event_type, payload, created_at)
SELECT 'fault.test', json_build_object('n', g, 'pad', repeat('x', 64))::text, now() + make_interval(secs => $2)
FROM generate_series(1, $1) g
RETURNING id::text, created_at`, pgx.Identifier{table}.Sanitize())
	return func(rng *rand.Rand, n int) (string, []any) {
		by := 0.0
		if rng.IntN(2) == 0 {
			by = ahead.Seconds()
		}
		return sql, []any{n, by}
	}
}

// producerConfig sizes a producer run.
type producerConfig struct {
	dsn    string
	conns  int        // connections, each writing its own transactions
	events int        // rows in total
	rate   float64    // rows per second, all connections together
	insert insertFunc // the statement of one transaction
	// insertFor, when set, gives connection i its own statement instead of
	// insert (e.g. rows of the keys that connection owns).
	insertFor func(conn int) insertFunc
	// maxRows bounds the rows of one transaction (1 to maxRows); 0 means 20.
	maxRows int
	// session, when set, is a statement run once on connection i before it
	// writes (e.g. a SET TimeZone of that producer).
	session func(conn int) string
	// more, when set, keeps the producers writing past events, at the same
	// rate, while it returns true: for a case whose faults must land while
	// rows still arrive, however long the harness takes to make them.
	more func() bool
}

// producers write outbox rows from several connections, 1 to 20 rows a
// transaction, at a steady rate, and record each row only after its
// transaction's COMMIT succeeded.
type producers struct {
	mu       sync.Mutex
	rows     []Committed
	errs     []error
	reserved atomic.Int64 // rows handed to transactions so far
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// start is when the producers began; done when the last one returned.
	start, done time.Time
}

// startProducers starts the producers; they stop after cfg.events rows
// (and once cfg.more says so) or at the test's end.
func startProducers(t testing.TB, cfg producerConfig) *producers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &producers{cancel: cancel}
	t.Cleanup(func() { cancel(); p.wg.Wait() })
	conns := make([]*pgx.Conn, cfg.conns)
	for i := range conns {
		conn, err := pgx.Connect(ctx, cfg.dsn)
		require.NoError(t, err)
		conns[i] = conn
		if cfg.session != nil {
			_, err := conn.Exec(ctx, cfg.session(i))
			require.NoError(t, err, "producer %d: %s", i, cfg.session(i))
		}
	}
	start := time.Now()
	p.start = start
	for i, conn := range conns {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { _ = conn.Close(context.Background()) }()
			defer p.returned()
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(i)))
			insert := cfg.insert
			if cfg.insertFor != nil {
				insert = cfg.insertFor(i)
			}
			maxRows := cfg.maxRows
			if maxRows <= 0 {
				maxRows = 20
			}
			for {
				n := int64(1 + rng.IntN(maxRows))
				end := p.reserved.Add(n)
				if over := end - int64(cfg.events); over > 0 && (cfg.more == nil || !cfg.more()) {
					n -= over
					if n <= 0 {
						return
					}
				}
				// Steady rate: this transaction is due when the rows before it
				// would have been written at cfg.rate.
				due := start.Add(time.Duration(float64(end-n) / cfg.rate * float64(time.Second)))
				if !sleepUntil(ctx, due) {
					return
				}
				rows, err := p.transaction(ctx, conn, rng, insert, int(n))
				if err != nil {
					if ctx.Err() == nil {
						p.fail(err)
					}
					return
				}
				p.record(rows)
			}
		}()
	}
	return p
}

// transaction inserts n rows in one transaction and returns them once
// COMMIT succeeded.
func (p *producers) transaction(ctx context.Context, conn *pgx.Conn, rng *rand.Rand, insert insertFunc, n int) ([]Committed, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sql, args := insert(rng, n)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, scanCommitted)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// scanCommitted scans a row returned as id::text, created_at and, when the
// statement returns a third column, the key as text (NULL: "").
func scanCommitted(row pgx.CollectableRow) (Committed, error) {
	var c Committed
	if len(row.FieldDescriptions()) < 3 {
		err := row.Scan(&c.ID, &c.CreatedAt)
		return c, err
	}
	var key *string
	err := row.Scan(&c.ID, &c.CreatedAt, &key)
	if key != nil {
		c.Key = *key
	}
	return c, err
}

func (p *producers) record(rows []Committed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows = append(p.rows, rows...)
}

// returned notes that a producer returned: the last one's time is done.
func (p *producers) returned() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = time.Now()
}

// took is how long the producers wrote, from their start until the last
// one returned (call it after wait).
func (p *producers) took() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done.Sub(p.start)
}

func (p *producers) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// committedCount is the number of rows committed so far.
func (p *producers) committedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.rows)
}

// wait waits until every producer has finished and requires that none failed.
func (p *producers) wait(t testing.TB) {
	t.Helper()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NoError(t, errors.Join(p.errs...), "producers")
}

// committed returns every row committed so far.
func (p *producers) committed() []Committed {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Committed(nil), p.rows...)
}

// add counts a row the case committed itself as the producers'.
func (p *producers) add(row Committed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows = append(p.rows, row)
}

// sleepUntil waits until t or ctx's end; false when ctx ended.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// insertRows runs one insert statement returning id::text, created_at in its
// own transaction and returns the committed rows.
func insertRows(t testing.TB, conn *pgx.Conn, sql string, args ...any) []Committed {
	t.Helper()
	var out []Committed
	err := pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(t.Context(), sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Committed, error) {
			var c Committed
			err := row.Scan(&c.ID, &c.CreatedAt)
			return c, err
		})
		return err
	})
	require.NoError(t, err)
	return out
}
