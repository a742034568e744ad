package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/netdial"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

type runOptions struct {
	ordering                 string
	cleanupMode              string
	source, slot             string
	catchUpMargin            time.Duration
	leaderTimeout            time.Duration
	partitions               int
	stream, deadLetterStream string
	batchSize                int
	inFlight                 int
	pollInterval             time.Duration
	busyPollInterval         time.Duration
	publishTimeout           time.Duration
	statementTimeout         time.Duration
	lockTimeout              time.Duration
	idleInTxTimeout          time.Duration
	maxLen                   int64
	maxPayloadBytes          int
	batchBytes               int
	missingTableRetry        time.Duration
	tcp                      netdial.TCP
	metricsAddr, probeAddr   string
	streamOpts               streamOptions // streamflags.go
	redisCheckInterval       time.Duration
}

// Defaults of the TCP flags: a silent PostgreSQL or Redis peer is noticed
// within about 30 s while data is in flight (TCP_USER_TIMEOUT) and within
// about 60 s on an idle link (keepalives).
const (
	defaultTCPUserTimeout    = 30 * time.Second
	defaultKeepaliveIdle     = 30 * time.Second
	defaultKeepaliveInterval = 10 * time.Second
	defaultKeepaliveCount    = 3
)

// netdialDefaults are the TCP settings of the other commands' Redis links.
func netdialDefaults() netdial.TCP {
	return netdial.TCP{UserTimeout: defaultTCPUserTimeout, KeepaliveIdle: defaultKeepaliveIdle,
		KeepaliveInterval: defaultKeepaliveInterval, KeepaliveCount: defaultKeepaliveCount}
}

// idleSpare is the least time left between a batch's longest wait in an
// open transaction and the idle-in-transaction limit.
const idleSpare = 5 * time.Second

func newRunCommand(c *common) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Relay outbox rows to the Redis stream until SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRelay(cmd.Context(), c, &o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.stream, "stream", relay.DefaultStream, "Redis stream to add events to")
	fs.StringVar(&o.deadLetterStream, "dead-letter-stream", "", "stream for rows that cannot be published (default <stream>.dead)")
	fs.IntVar(&o.batchSize, "batch-size", relay.DefaultBatchSize, fmt.Sprintf("rows claimed per transaction (1..%d)", relay.MaxBatchSize))
	fs.IntVar(&o.batchBytes, "batch-bytes", relay.DefaultBatchBytes, fmt.Sprintf(
		"bytes of ids, types and payloads a batch may hold in memory (at least %d): a claim over it is made again "+
			"with the rows that fit, so large payloads are claimed a few at a time; a single larger row is still claimed, alone",
		relay.MinBatchBytes))
	fs.IntVar(&o.inFlight, "in-flight", relay.DefaultInFlight,
		"batches in flight at once (1..8): the next is claimed while one is published; order is kept")
	fs.DurationVar(&o.pollInterval, "poll-interval", relay.DefaultPollInterval, "pause after a pass that found no row")
	fs.DurationVar(&o.busyPollInterval, "busy-poll-interval", relay.DefaultBusyPollInterval,
		"pause after a pass that found rows but not a full batch (at most --poll-interval)")
	fs.DurationVar(&o.publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "deadline of one batch's XADD pipeline")
	fs.DurationVar(&o.statementTimeout, "statement-timeout", 30*time.Second, "PostgreSQL statement_timeout of the relay's sessions")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 5*time.Second, "PostgreSQL lock_timeout of the relay's sessions")
	fs.DurationVar(&o.idleInTxTimeout, "idle-in-transaction-timeout", time.Minute,
		"PostgreSQL idle_in_transaction_session_timeout: a relay cut off mid-batch loses its locks after this")
	fs.Int64Var(&o.maxLen, "max-len", 0, "trim the stream to about this many entries (XADD MAXLEN ~); 0 keeps all")
	fs.IntVar(&o.maxPayloadBytes, "max-payload-bytes", relay.DefaultMaxPayloadBytes, "larger payloads are dead-lettered")
	fs.DurationVar(&o.missingTableRetry, "missing-table-retry-interval", relay.DefaultMissingTableBackoff,
		"retry interval while the outbox table or one of its columns is missing")
	fs.DurationVar(&o.tcp.UserTimeout, "tcp-user-timeout", defaultTCPUserTimeout,
		"TCP_USER_TIMEOUT on both ends of the PostgreSQL link (the server's tcp_user_timeout) and on the Redis link: "+
			"unacknowledged data (or a peer that stopped reading) ends the connection after this; 0 keeps the system's default")
	fs.DurationVar(&o.tcp.KeepaliveIdle, "keepalive-idle", defaultKeepaliveIdle,
		"idle time before the first TCP keepalive probe (both ends of PostgreSQL, and Redis)")
	fs.DurationVar(&o.tcp.KeepaliveInterval, "keepalive-interval", defaultKeepaliveInterval, "time between TCP keepalive probes")
	fs.IntVar(&o.tcp.KeepaliveCount, "keepalive-count", defaultKeepaliveCount, "unanswered keepalive probes that end a connection")
	fs.DurationVar(&o.redisCheckInterval, "redis-check-interval", doctor.DefaultMonitorInterval,
		"run the Redis durability checks of relay doctor at start and this often (log and gauge outbox_relay_redis_check); 0 disables")
	fs.StringVar(&o.ordering, "ordering", string(relay.OrderingNone),
		"None: any number of relays, no order across batches; Strict: one active relay (fenced leader, the others stand by), "+
			"the stream in (created_at, id) claim order; PerKey: the same per value of --key-column, with many relays")
	fs.StringVar(&o.cleanupMode, "cleanup-mode", outbox.MarkDispatched.String(),
		"AfterRetention: a claim marks its rows dispatched and relay cleanup deletes them after the retention "+
			"(a replay can republish them); OnDispatch: a claim deletes its rows, committed after Redis acknowledged them "+
			"(no cleanup, nothing to replay)")
	fs.StringVar(&o.source, "source", string(relay.SourcePolling),
		"Polling: claim pending rows with SQL; LogicalReplication: stream the table's inserts from a replication slot "+
			"(--slot) in commit order, confirmed after Redis acknowledged them (wal_level=logical, a role with REPLICATION)")
	fs.StringVar(&o.slot, "slot", "", "source LogicalReplication: the replication slot, one per relay deployment "+
		"(lower-case letters, digits and _; created when missing)")
	fs.DurationVar(&o.catchUpMargin, "catch-up-margin", relay.DefaultCatchUpMargin,
		"source LogicalReplication: when a slot is made again, the rows created since its last published commit less this "+
			"are republished from the table (transactions that ran longer across that commit are covered)")
	fs.IntVar(&o.partitions, "partitions", relay.DefaultPartitions,
		fmt.Sprintf("PerKey: key partitions, the most relays that share the work (1..%d); the same for every relay of a table",
			relay.MaxPartitions))
	fs.DurationVar(&o.leaderTimeout, "leader-timeout", relay.DefaultLeaderTimeout,
		"ordering Strict: a leader that stops answering loses the leadership after this (its session's idle_session_timeout)")
	o.streamOpts.addFlags(fs)
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of /metrics; 0 disables")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables")
	return cmd
}

// validate refuses values that the relay's Config would silently replace by
// its defaults (a zero) or refuse less clearly.
func (o *runOptions) validate(c *common) error {
	var errs []error
	if o.batchSize < 1 || o.batchSize > relay.MaxBatchSize {
		errs = append(errs, fmt.Errorf("--batch-size %d: must be between 1 and %d", o.batchSize, relay.MaxBatchSize))
	}
	if o.inFlight < 1 || o.inFlight > 8 {
		errs = append(errs, fmt.Errorf("--in-flight %d: must be between 1 and 8", o.inFlight))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--poll-interval", o.pollInterval}, {"--busy-poll-interval", o.busyPollInterval},
		{"--publish-timeout", o.publishTimeout}, {"--statement-timeout", o.statementTimeout},
		{"--lock-timeout", o.lockTimeout}, {"--missing-table-retry-interval", o.missingTableRetry},
		{"--idle-in-transaction-timeout", o.idleInTxTimeout}, {"--catch-up-margin", o.catchUpMargin},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.flag, d.v))
		}
	}
	if o.batchBytes < relay.MinBatchBytes {
		errs = append(errs, fmt.Errorf("--batch-bytes %d: must be at least %d", o.batchBytes, relay.MinBatchBytes))
	}
	if o.maxPayloadBytes < 1 {
		errs = append(errs, fmt.Errorf("--max-payload-bytes %d: must be positive", o.maxPayloadBytes))
	}
	if o.redisCheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--redis-check-interval %s: must be 0 (off) or positive", o.redisCheckInterval))
	}
	if o.maxLen < 0 {
		errs = append(errs, fmt.Errorf("--max-len %d: must be 0 (off) or positive", o.maxLen))
	}
	if o.tcp.UserTimeout < 0 || o.tcp.KeepaliveIdle < 0 || o.tcp.KeepaliveInterval < 0 || o.tcp.KeepaliveCount < 0 {
		errs = append(errs, errors.New("--tcp-user-timeout, --keepalive-idle, --keepalive-interval and --keepalive-count must not be negative"))
	}
	if _, err := relay.ParseOrdering(o.ordering); err != nil {
		errs = append(errs, fmt.Errorf("--ordering: %w", err))
	}
	if ord, err := relay.ParseOrdering(o.ordering); err == nil && ord == relay.OrderingPerKey && c.columns.Key == "" {
		errs = append(errs, errors.New("--ordering PerKey needs --key-column: the column whose events are ordered per value"))
	}
	if d, err := outbox.ParseDispatch(o.cleanupMode); err != nil {
		errs = append(errs, fmt.Errorf("--cleanup-mode: %w", err))
	} else if d == outbox.DeleteOnDispatch && o.streamOpts.autoReplay {
		errs = append(errs, errors.New(
			"--auto-replay republishes dispatched rows, which --cleanup-mode OnDispatch deletes: use one or the other"))
	}
	if src, err := relay.ParseSource(o.source); err != nil {
		errs = append(errs, fmt.Errorf("--source: %w", err))
	} else if src == relay.SourceLogicalReplication && o.slot == "" {
		errs = append(errs, errors.New("--source LogicalReplication needs --slot: the replication slot this relay streams from"))
	}
	if o.partitions < 1 || o.partitions > relay.MaxPartitions {
		errs = append(errs, fmt.Errorf("--partitions %d: must be between 1 and %d", o.partitions, relay.MaxPartitions))
	}
	if o.leaderTimeout < time.Second {
		errs = append(errs, fmt.Errorf("--leader-timeout %s: must be at least 1s", o.leaderTimeout))
	}
	if err := o.checkIdleLimit(); err != nil {
		errs = append(errs, err)
	}
	if err := o.streamOpts.validate(o.publishTimeout); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkIdleLimit refuses timeouts that let a healthy batch outlive the
// idle-in-transaction limit: a batch's session sits idle in its open
// transaction while the batches claimed before it publish (in-flight - 1 of
// them at most) and while it publishes itself, each up to publish-timeout.
// Past the limit the server ends the session, and every such batch would
// roll back before its COMMIT, forever.
func (o *runOptions) checkIdleLimit() error {
	if o.publishTimeout <= 0 || o.idleInTxTimeout <= 0 || o.inFlight < 1 {
		return nil // reported above
	}
	longestIdle := time.Duration(o.inFlight) * o.publishTimeout
	if longestIdle+idleSpare <= o.idleInTxTimeout {
		return nil
	}
	return fmt.Errorf("--publish-timeout %s x --in-flight %d = %s (plus %s to spare) must stay below --idle-in-transaction-timeout %s: "+
		"a batch waits that long in its open transaction, and the server would end it before every COMMIT; "+
		"lower --publish-timeout or raise --idle-in-transaction-timeout",
		o.publishTimeout, o.inFlight, longestIdle, idleSpare, o.idleInTxTimeout)
}

func runRelay(ctx context.Context, c *common, o *runOptions) error {
	if err := o.validate(c); err != nil {
		return err
	}
	log, err := c.logger()
	if err != nil {
		return err
	}
	table, err := c.outboxTable()
	if err != nil {
		return err
	}
	dsn, err := secretEnv(envDatabaseURL)
	if err != nil {
		return err
	}
	redisURL, err := secretEnv(envRedisURL)
	if err != nil {
		return err
	}
	poolCfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{
		StatementTimeout:         o.statementTimeout,
		LockTimeout:              o.lockTimeout,
		IdleInTransactionTimeout: o.idleInTxTimeout,
		ApplicationName:          "outbox-relay",
		TCP:                      o.tcp,
		StablePlans:              true,
		WarmAllocator:            true,
	}, int32(o.inFlight)+3) // the batches in flight, the NOTIFY listener, the leader session, one spare
	if err != nil {
		return err
	}
	db, err := pgxpool.NewWithConfig(ctx, poolCfg) // connects lazily
	if err != nil {
		return fmt.Errorf("creating PostgreSQL pool: %w", err)
	}
	defer db.Close()
	rdb, err := newRedisClient(redisURL, c.redisCAFile, o.publishTimeout, o.tcp)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := metrics.Register(reg); err != nil {
		return err
	}
	ordering, err := relay.ParseOrdering(o.ordering)
	if err != nil {
		return fmt.Errorf("--ordering: %w", err)
	}
	dispatch, err := outbox.ParseDispatch(o.cleanupMode)
	if err != nil {
		return fmt.Errorf("--cleanup-mode: %w", err)
	}
	source, err := relay.ParseSource(o.source)
	if err != nil {
		return fmt.Errorf("--source: %w", err)
	}
	var replication *pgconn.Config
	if source == relay.SourceLogicalReplication {
		replication = poolCfg.ConnConfig.Config.Copy() // the pool's TLS and dialer; the reader sets its own parameters
	}
	cfg := relay.Config{
		Ordering:            ordering,
		Dispatch:            dispatch,
		Source:              source,
		Slot:                o.slot,
		Replication:         replication,
		CatchUpMargin:       o.catchUpMargin,
		LeaderTimeout:       o.leaderTimeout,
		Partitions:          o.partitions,
		Table:               table,
		Stream:              o.stream,
		DeadLetterStream:    o.deadLetterStream,
		BatchSize:           o.batchSize,
		BatchBytes:          o.batchBytes,
		InFlight:            o.inFlight,
		PollInterval:        o.pollInterval,
		BusyPollInterval:    o.busyPollInterval,
		PublishTimeout:      o.publishTimeout,
		MaxLen:              o.maxLen,
		MaxPayloadBytes:     o.maxPayloadBytes,
		MissingTableBackoff: o.missingTableRetry,
		Database:            databaseName(dsn),
		Logger:              log,
		Metrics:             metrics,
	}
	o.streamOpts.apply(&cfg)
	r, err := relay.New(cfg, db, rdb)
	if err != nil {
		return err
	}

	startRedisMonitor(ctx, o, rdb, reg, log)

	servers, err := startServers(log, o, reg, r)
	if err != nil {
		return err
	}
	defer shutdown(servers)
	return r.Run(ctx)
}

// startServers serves /metrics and the probes. A port that cannot be bound
// is an error at start, not a silent gap in monitoring.
func startServers(log *slog.Logger, o *runOptions, reg *prometheus.Registry, r *relay.Relay) ([]*http.Server, error) {
	var servers []*http.Server
	add := func(addr string, h http.Handler) error {
		if addr == "0" || addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server failed", "address", addr, "error", err.Error())
			}
		}()
		return nil
	}
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	if o.metricsAddr == o.probeAddr && o.metricsAddr != "0" {
		metrics.Handle("/", probes)
		err := add(o.metricsAddr, metrics)
		return servers, err
	}
	if err := add(o.metricsAddr, metrics); err != nil {
		shutdown(servers)
		return nil, err
	}
	if err := add(o.probeAddr, probes); err != nil {
		shutdown(servers)
		return nil, err
	}
	return servers, nil
}

func shutdown(servers []*http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(ctx)
	}
}
