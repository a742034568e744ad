package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// testBundle is what a consumer test works with: a fresh database with the
// processed-events table and an effects table the test handler writes, a
// Redis client, and a stream and group of the test's own.
type testBundle struct {
	dsn      string
	db       *pgxpool.Pool
	redisURL string
	rdb      *redis.Client
	stream   string
	group    string
	handler  *recorder
}

type bundleOpts struct {
	dsn      string // default: a fresh database on the shared server
	redisURL string // default: the shared server
}

const effectsDDL = `CREATE TABLE effects (event_id text NOT NULL, consumer text NOT NULL, deliveries int NOT NULL);`

func setup(t *testing.T, o bundleOpts) *testBundle {
	t.Helper()
	if o.dsn == "" {
		o.dsn = testenv.Postgres(t)
	}
	if o.redisURL == "" {
		o.redisURL = testenv.Redis(t)
	}
	b := &testBundle{dsn: o.dsn, redisURL: o.redisURL, stream: testenv.Name(t), group: "workers"}
	b.db = b.newPool(t)
	ddl, err := ProcessedTableDDL("")
	require.NoError(t, err)
	_, err = b.db.Exec(context.Background(), ddl+effectsDDL)
	require.NoError(t, err)
	b.rdb = b.newRedis(t)
	b.handler = &recorder{calls: map[string]int{}}
	return b
}

func (b *testBundle) newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.dsn)
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "10000"
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

func (b *testBundle) newRedis(t *testing.T) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(b.redisURL)
	require.NoError(t, err)
	opts.DialTimeout = time.Second
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newConsumer builds a consumer of the bundle's stream with the recording
// handler, quick retries and a quiet log, unless cfg says otherwise.
func (b *testBundle) newConsumer(t *testing.T, cfg Config) *Consumer {
	t.Helper()
	return b.newConsumerWith(t, cfg, b.db, b.rdb)
}

func (b *testBundle) newConsumerWith(t *testing.T, cfg Config, db *pgxpool.Pool, rdb redis.UniversalClient) *Consumer {
	t.Helper()
	cfg.Stream = b.stream
	cfg.Group = b.group
	if cfg.Consumer == "" {
		cfg.Consumer = "c1"
	}
	if cfg.Handler == nil {
		cfg.Handler = b.handler.handle(cfg.Consumer, nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	}
	cfg.Block = cmpOr(cfg.Block, 50*time.Millisecond)
	c, err := New(cfg, db, rdb)
	require.NoError(t, err)
	return c
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// publish adds an entry of the relay's shape and returns its stream id.
func (b *testBundle) publish(t *testing.T, eventID, eventType, payload string) string {
	t.Helper()
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{
		Stream: b.stream,
		Values: []any{FieldEventID, eventID, FieldEventType, eventType, FieldPayload, payload},
	}).Result()
	require.NoError(t, err)
	return id
}

// run runs c until the test ends, or until stop is called, which returns
// Run's result.
func run(t *testing.T, c *Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	return runCtx(t, ctx, cancel, c)
}

func runCtx(t *testing.T, ctx context.Context, cancel context.CancelFunc, c *Consumer) (stop func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = fmt.Errorf("consumer did not stop within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// effects counts the effects table's rows per event id.
func (b *testBundle) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT event_id, count(*) FROM effects GROUP BY 1`)
	require.NoError(t, err)
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	require.NoError(t, err)
	return out
}

// pending is the number of entries of the group not acknowledged yet, -1
// before the group exists.
func (b *testBundle) pending(t *testing.T) int64 {
	t.Helper()
	p, err := b.rdb.XPending(context.Background(), b.stream, b.group).Result()
	if err != nil {
		return -1 // no group yet
	}
	return p.Count
}

// deadLetters reads the dead-letter stream.
func (b *testBundle) deadLetters(t *testing.T) []map[string]string {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.stream+".dead", "-", "+").Result()
	require.NoError(t, err)
	out := make([]map[string]string, len(msgs))
	for i, m := range msgs {
		out[i] = newMessage(m, 0).Fields
	}
	return out
}

// waitFor polls cond until it holds, failing after 60s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, testenv.True(cond))
}

// recorder is a handler that writes one effects row per run, in the
// transaction, and counts its runs per event id.
type recorder struct {
	mu       sync.Mutex
	calls    map[string]int
	messages []Message
}

// handle returns the handler of one consumer; before, when not nil, runs
// first and may fail the entry.
func (r *recorder) handle(consumer string, before func(ctx context.Context, tx pgx.Tx, m Message) error) Handler {
	return func(ctx context.Context, tx pgx.Tx, m Message) error {
		r.mu.Lock()
		r.calls[m.EventID]++
		r.messages = append(r.messages, m)
		r.mu.Unlock()
		if before != nil {
			if err := before(ctx, tx, m); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, consumer, deliveries) VALUES ($1, $2, $3)`,
			m.EventID, consumer, m.Deliveries)
		return err
	}
}

func (r *recorder) callsOf(eventID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[eventID]
}

func (r *recorder) all() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.messages...)
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
