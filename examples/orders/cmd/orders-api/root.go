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
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/examples/orders"
	"github.com/outbox-dev/outbox-operator/internal/logging"
	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
)

// envDatabaseURL carries the connection string; it is never a flag, so it
// never shows in a process list or a pod spec's args.
const envDatabaseURL = "DATABASE_URL"

// options are the flags of orders-api.
type options struct {
	log             logging.Flags
	bindAddress     string
	shutdownTimeout time.Duration
	// listening, when set, is told the address the API listens on (tests
	// bind port 0).
	listening func(addr string)
}

func newRootCommand(getenv func(string) string, listening func(addr string)) *cobra.Command {
	o := &options{listening: listening}
	root := &cobra.Command{
		Use:           "orders-api",
		Short:         "The sample orders API: each order and its order_created outbox row in one transaction",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), cmd.ErrOrStderr(), getenv, o)
		},
	}
	o.log.AddFlags(root.PersistentFlags())
	root.Flags().StringVar(&o.bindAddress, "bind-address", ":8080", "address of the API and of /healthz and /readyz")
	root.Flags().DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second,
		"how long requests in flight may take to finish after SIGTERM")
	root.AddCommand(newMigrateCommand(getenv, o))
	return root
}

// connect opens a pool on DATABASE_URL; it connects lazily.
func connect(ctx context.Context, getenv func(string) string, maxConns int32) (*pgxpool.Pool, error) {
	dsn := getenv(envDatabaseURL)
	if dsn == "" {
		return nil, fmt.Errorf("%s is not set: orders-api reads its connection string from the environment only",
			envDatabaseURL)
	}
	cfg, err := ioutbox.PoolConfig(dsn, ioutbox.SessionSettings{
		StatementTimeout:         10 * time.Second,
		LockTimeout:              5 * time.Second,
		IdleInTransactionTimeout: 30 * time.Second,
		ApplicationName:          "orders-api",
	}, maxConns)
	if err != nil {
		return nil, err
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating PostgreSQL pool: %w", err)
	}
	return db, nil
}

func serve(ctx context.Context, logTo io.Writer, getenv func(string) string, o *options) error {
	log, err := o.log.Logger(logTo)
	if err != nil {
		return err
	}
	db, err := connect(ctx, getenv, 10)
	if err != nil {
		return err
	}
	defer db.Close()

	ln, err := net.Listen("tcp", o.bindAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.bindAddress, err)
	}
	srv := &http.Server{
		Handler:           orders.NewAPI(orders.NewStore(db), log).Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("Serving the orders API", "address", ln.Addr().String())
	if o.listening != nil {
		o.listening(ln.Addr().String())
	}

	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("Stopped the orders API")
	return nil
}
