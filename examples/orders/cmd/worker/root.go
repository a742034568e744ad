package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/examples/orders"
	"github.com/outbox-dev/outbox-operator/internal/logging"
	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// Environment variables that carry secrets; they are never flags.
const (
	envDatabaseURL = "DATABASE_URL"
	envRedisURL    = "REDIS_URL"
)

type options struct {
	log       logging.Flags
	cfg       consumer.Config
	probeAddr string
	// listening, when set, is told the address of the probes (tests bind
	// port 0).
	listening func(addr string)
}

func newRootCommand(getenv func(string) string, listening func(addr string)) *cobra.Command {
	o := &options{listening: listening}
	cmd := &cobra.Command{
		Use:           "worker",
		Short:         "The sample worker: one confirmation email per order_created event, exactly once",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), cmd.ErrOrStderr(), getenv, o)
		},
	}
	fs := cmd.Flags()
	o.log.AddFlags(fs)
	fs.StringVar(&o.cfg.Stream, "stream", consumer.DefaultStream, "Redis stream to consume")
	fs.StringVar(&o.cfg.Group, "group", consumer.DefaultGroup, "consumer group (created when missing)")
	fs.StringVar(&o.cfg.Consumer, "consumer", "", "consumer name in the group (default $POD_NAME, else the host name)")
	fs.StringVar(&o.cfg.DeadLetterStream, "dead-letter-stream", "", "stream for entries that failed (default <stream>.dead)")
	fs.IntVar(&o.cfg.MaxDeliveries, "max-deliveries", consumer.DefaultMaxDeliveries,
		"deliveries of a failing entry before it is dead-lettered")
	fs.IntVar(&o.cfg.BatchSize, "batch-size", consumer.DefaultBatchSize,
		fmt.Sprintf("entries read at once (1..%d)", consumer.MaxBatchSize))
	fs.DurationVar(&o.cfg.Block, "block", consumer.DefaultBlock, "how long one read waits for new entries")
	fs.DurationVar(&o.cfg.MinIdle, "min-idle", consumer.DefaultMinIdle,
		"how long an entry stays pending (failed, or its consumer died) before it is reclaimed")
	fs.DurationVar(&o.cfg.ClaimInterval, "claim-interval", consumer.DefaultClaimInterval, "time between reclaim passes")
	fs.DurationVar(&o.cfg.HandlerTimeout, "handler-timeout", consumer.DefaultHandlerTimeout, "bound of one entry's transaction")
	fs.StringVar(&o.cfg.ProcessedTable, "processed-table", consumer.DefaultProcessedTable,
		"table of processed event ids, optionally schema-qualified")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables")
	return cmd
}

func run(ctx context.Context, logTo io.Writer, getenv func(string) string, o *options) error {
	log, err := o.log.Logger(logTo)
	if err != nil {
		return err
	}
	dsn, redisURL := getenv(envDatabaseURL), getenv(envRedisURL)
	for _, env := range []struct{ name, value string }{{envDatabaseURL, dsn}, {envRedisURL, redisURL}} {
		if env.value == "" {
			return fmt.Errorf("%s is not set: the worker reads its connection strings from the environment only", env.name)
		}
	}
	poolCfg, err := ioutbox.PoolConfig(dsn, ioutbox.SessionSettings{
		StatementTimeout:         30 * time.Second,
		LockTimeout:              10 * time.Second,
		IdleInTransactionTimeout: time.Minute,
		ApplicationName:          "orders-worker",
	}, 2)
	if err != nil {
		return err
	}
	db, err := pgxpool.NewWithConfig(ctx, poolCfg) // connects lazily
	if err != nil {
		return fmt.Errorf("creating PostgreSQL pool: %w", err)
	}
	defer db.Close()
	ropts, err := redis.ParseURL(redisURL)
	if err != nil {
		// go-redis errors do not echo the URL, but say nothing more to be safe.
		return fmt.Errorf("parsing %s: not a valid redis:// or rediss:// URL", envRedisURL)
	}
	ropts.DialTimeout = 5 * time.Second
	ropts.PoolSize = 4
	rdb := redis.NewClient(ropts)
	defer func() { _ = rdb.Close() }()

	cfg := o.cfg
	if cfg.Consumer == "" {
		cfg.Consumer = getenv(consumer.EnvPodName) // else the consumer takes the host name
	}
	cfg.Handler = orders.ConfirmationEmails(log)
	cfg.Logger = log
	c, err := consumer.New(cfg, db, rdb)
	if err != nil {
		return err
	}
	srv, err := serveProbes(log, o, c)
	if err != nil {
		return err
	}
	if srv != nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	return c.Run(ctx)
}

// serveProbes serves /healthz and /readyz (nil server when disabled). A port
// that cannot be bound is an error at start.
func serveProbes(log *slog.Logger, o *options, c *consumer.Consumer) (*http.Server, error) {
	if o.probeAddr == "0" || o.probeAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", o.probeAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", o.probeAddr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := c.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("Probe server failed", "address", o.probeAddr, "error", err.Error())
		}
	}()
	if o.listening != nil {
		o.listening(ln.Addr().String())
	}
	return srv, nil
}
