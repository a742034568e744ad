package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
	"github.com/outbox-dev/outbox-operator/test/localcluster/supervise"
	"github.com/redis/go-redis/v9"
)

// The demo's credentials: those of config/samples (DEMO values).
const (
	demoDBUser     = "app"
	demoDBName     = "app"
	demoPassword   = "demo-password-change-me"
	demoServices   = "demo-services"
	demoStatusFile = "demo-services.json"
)

// demoEndpoints is what the demo needs to know of the host's servers.
type demoEndpoints struct {
	PostgresPort int    `json:"postgresPort"`
	RedisPort    int    `json:"redisPort"`
	Gateway      string `json:"gateway"`
}

// demoServicesCmd starts (or finds running) PostgreSQL and Redis on the host for
// the sample, detached, recorded by pid in the cluster's state so that `down`
// stops them, and prints their ports and the gateway address as shell
// variables: PG_PORT, REDIS_PORT, GATEWAY.
func demoServicesCmd(args []string) error {
	fs := flag.NewFlagSet(demoServices, flag.ExitOnError)
	dir := stateFlag(fs)
	_ = fs.Parse(args)
	s, err := cluster.Load(*dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s (run up first): %w", *dir, err)
	}
	statusPath := filepath.Join(s.StateDir, demoStatusFile)
	pidFile := filepath.Join(s.PidDir(), demoServices+".pid")
	if _, alive := supervise.AliveFromFile(pidFile); !alive {
		_ = os.Remove(statusPath)
		self, err := os.Executable()
		if err != nil {
			return err
		}
		spec := supervise.Spec{Name: demoServices, Path: self, Args: []string{"demo-services-run", "--state-dir", s.StateDir}}
		if _, err := supervise.Start(spec, s.PidDir(), s.LogDir()); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "Starting PostgreSQL and Redis on the host (log: %s) ...\n", filepath.Join(s.LogDir(), demoServices+".log"))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, err := os.ReadFile(statusPath)
		if err == nil {
			var ep demoEndpoints
			if err := json.Unmarshal(b, &ep); err != nil {
				return err
			}
			fmt.Printf("PG_PORT=%d\nREDIS_PORT=%d\nGATEWAY=%s\n", ep.PostgresPort, ep.RedisPort, ep.Gateway)
			return nil
		}
		if _, alive := supervise.AliveFromFile(pidFile); !alive || time.Now().After(deadline) {
			return fmt.Errorf("PostgreSQL and Redis did not start; see %s", filepath.Join(s.LogDir(), demoServices+".log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// demoServicesRun is the detached process: it runs the servers until SIGTERM.
func demoServicesRun(args []string) (err error) {
	fs := flag.NewFlagSet("demo-services-run", flag.ExitOnError)
	dir := stateFlag(fs)
	_ = fs.Parse(args)
	s, err := cluster.Load(*dir)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// Pods cannot reach the host's loopback: the servers also listen on the
	// gateway, the host's address on the pod bridge (PostgreSQL asks the pod
	// range for the sample's password; loopback stays trusted).
	pg, err := testenv.LaunchPostgres(testenv.WithPostgresListen(s.Gateway, s.PodCIDR))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pg.Close()) }()
	rd, err := testenv.LaunchRedis(testenv.WithAppendOnly(), testenv.WithRedisArgs("--bind", "127.0.0.1", s.Gateway))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rd.Close()) }()
	ep, err := prepareDemoServers(ctx, pg.DSN(), rd.URL())
	if err != nil {
		return err
	}
	ep.Gateway = s.Gateway
	b, _ := json.Marshal(ep)
	if err := os.WriteFile(filepath.Join(s.StateDir, demoStatusFile), b, 0o644); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL on 127.0.0.1:%d, Redis on 127.0.0.1:%d; running until SIGTERM.\n", ep.PostgresPort, ep.RedisPort)
	<-ctx.Done()
	fmt.Println("Stopping PostgreSQL and Redis.")
	return nil
}

// prepareDemoServers creates the sample's role and database, and sets the
// sample's Redis password.
func prepareDemoServers(ctx context.Context, dsn, redisURL string) (demoEndpoints, error) {
	var ep demoEndpoints
	pu, err := url.Parse(dsn)
	if err != nil {
		return ep, err
	}
	if ep.PostgresPort, err = strconv.Atoi(pu.Port()); err != nil {
		return ep, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return ep, err
	}
	defer func() { _ = conn.Close(ctx) }()
	for _, stmt := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", pgx.Identifier{demoDBUser}.Sanitize(), demoPassword),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", pgx.Identifier{demoDBName}.Sanitize(), pgx.Identifier{demoDBUser}.Sanitize()),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return ep, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return ep, err
	}
	ru, _ := url.Parse(redisURL)
	if ep.RedisPort, err = strconv.Atoi(ru.Port()); err != nil {
		return ep, err
	}
	rc := redis.NewClient(opts)
	defer func() { _ = rc.Close() }()
	if err := rc.ConfigSet(ctx, "requirepass", demoPassword).Err(); err != nil {
		return ep, errors.Join(errors.New("setting the Redis password"), err)
	}
	return ep, nil
}
