package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redact"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// errChecksFailed makes `relay doctor` exit 1 after printing its report.
var errChecksFailed = errors.New("a check failed (see the report above)")

type doctorOptions struct {
	stream, deadLetterStream string
	output                   string
	timeout                  time.Duration
	skipPostgres, skipRedis  bool
	slot                     string
	maxRetainedWAL           int64
}

func newDoctorCommand(c *common) *cobra.Command {
	var o doctorOptions
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that the outbox table, its role and Redis can keep the relay's promise",
		Long: `Preflight checks, one line each: ok, info, warn or fail, with a fix.

PostgreSQL (DATABASE_URL): the table and its columns with usable types, the
partial pending index, the role's privileges (SELECT, UPDATE, DELETE; INSERT on
the dead-letter table), the optional NOTIFY trigger, and one relay per table:
relays of other streams or sources than --stream and --slot registered in
<table>_relays and seen within 30s fail. With --slot (source
LogicalReplication): wal_level logical, the role's REPLICATION attribute,
max_slot_wal_keep_size set (unset: warn, a stopped relay can fill the disk),
and the slot: invalidated (fail) or retaining more WAL than
--max-retained-wal-bytes (warn).

Redis (REDIS_URL, --redis-ca-file): reachable and authenticated, a master,
maxmemory-policy (anything but noeviction under a maxmemory can evict the
stream: fail), persistence (none at all: fail; RDB only or appendfsync no:
warn), the replicas attached, the stream and dead-letter stream types, the
consumer groups and their lag. A server that denies CONFIG (ACL, or a managed
Redis that renames it) gets "unknown" (warn) with how to check by hand.

Exits 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(o.output); err != nil {
				return err
			}
			if o.timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive", o.timeout)
			}
			table, err := c.outboxTable()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			var report doctor.Report
			if !o.skipPostgres {
				report = append(report, doctorPostgres(ctx, table, &o)...)
			}
			if !o.skipRedis {
				report = append(report, doctorRedis(ctx, c, &o)...)
			}
			out := cmd.OutOrStdout()
			if o.output == outputJSON {
				err = report.WriteJSON(out)
			} else {
				err = report.WriteText(out)
			}
			if err == nil && report.Failed() {
				err = errChecksFailed
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.stream, "stream", relay.DefaultStream, "the relay's Redis stream")
	fs.StringVar(&o.deadLetterStream, "dead-letter-stream", "", "the relay's dead-letter stream (default <stream>.dead)")
	addOutputFlag(fs, &o.output)
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline of all checks")
	fs.BoolVar(&o.skipPostgres, "skip-postgres", false, "check Redis only (DATABASE_URL is not needed)")
	fs.BoolVar(&o.skipRedis, "skip-redis", false, "check PostgreSQL only (REDIS_URL is not needed)")
	fs.StringVar(&o.slot, "slot", "", "source LogicalReplication: also check the replication settings and this slot")
	fs.Int64Var(&o.maxRetainedWAL, "max-retained-wal-bytes", doctor.DefaultMaxRetainedWAL,
		"with --slot: warn when the slot retains more WAL than this")
	return cmd
}

func doctorPostgres(ctx context.Context, table *outbox.Table, o *doctorOptions) doctor.Report {
	fail := func(msg, fix string) doctor.Report {
		return doctor.Report{{Name: "postgres.connection", Status: doctor.Fail, Message: msg, Fix: fix}}
	}
	dsn, err := secretEnv(envDatabaseURL)
	if err != nil {
		return fail(err.Error()+".", "export DATABASE_URL=postgres://user:password@host:5432/db")
	}
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		return fail(envDatabaseURL+" is not a PostgreSQL connection string.", "a postgres:// URL or key=value pairs")
	}
	cfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{
		StatementTimeout: 10 * time.Second, LockTimeout: 2 * time.Second,
		IdleInTransactionTimeout: 10 * time.Second, ApplicationName: "outbox-relay-doctor",
	}, 1)
	if err != nil {
		return fail(redact.String(err.Error(), dsn), "")
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(redact.String(err.Error(), dsn), "")
	}
	defer db.Close()
	f := doctor.GatherPostgres(ctx, db, table)
	r := doctor.PostgresChecks(f, table)
	if f.TableFound {
		r = append(r, doctor.RelaysCheck(f, table, outbox.TableRelay{Stream: o.stream, Slot: o.slot}))
	}
	if o.slot != "" && !r.Failed() {
		r = append(r, doctor.ReplicationChecks(doctor.GatherReplication(ctx, db, o.slot), o.slot, o.maxRetainedWAL)...)
	}
	password := cfg.ConnConfig.Password
	for i := range r {
		r[i].Message = redact.String(r[i].Message, dsn, password)
	}
	return r
}

func doctorRedis(ctx context.Context, c *common, o *doctorOptions) doctor.Report {
	fail := func(msg, fix string) doctor.Report {
		return doctor.Report{{Name: doctor.ConnectionCheckName, Status: doctor.Fail, Reason: doctor.ReasonUnreachable, Message: msg, Fix: fix}}
	}
	redisURL, err := secretEnv(envRedisURL)
	if err != nil {
		return fail(err.Error()+".", "export REDIS_URL=redis://user:password@host:6379/0")
	}
	rdb, err := newRedisClient(redisURL, c.redisCAFile, 5*time.Second, netdialDefaults())
	if err != nil {
		return fail(err.Error()+".", "")
	}
	defer func() { _ = rdb.Close() }()
	t := doctor.RedisTarget{Stream: o.stream, DeadLetterStream: o.deadLetterStream}
	if t.DeadLetterStream == "" {
		t.DeadLetterStream = o.stream + ".dead"
	}
	r := doctor.RedisChecks(doctor.GatherRedis(ctx, rdb, t), t)
	var password string
	if u, err := url.Parse(redisURL); err == nil && u.User != nil {
		password, _ = u.User.Password()
	}
	for i := range r {
		r[i].Message = redact.String(r[i].Message, redisURL, password)
	}
	return r
}
