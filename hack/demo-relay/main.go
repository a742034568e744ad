// Command demo-relay shows the relay at work on this machine, with no
// cluster: it starts a throwaway PostgreSQL and Redis, creates the outbox
// table with `relay schema --apply`, writes a few events the way an
// application does (in its own transactions), runs `relay run`, prints the
// stream entries and `relay backlog`, and stops everything it started.
// Run it with `make demo-relay`.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "demo-relay:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) (err error) {
	tmp, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // best effort
	bin := filepath.Join(tmp, "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/relay").CombinedOutput(); err != nil {
		return fmt.Errorf("building relay: %w\n%s", err, out)
	}
	pg, err := testenv.LaunchPostgres()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pg.Close()) }()
	rs, err := testenv.LaunchRedis()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rs.Close()) }()
	env := append(os.Environ(), "DATABASE_URL="+pg.DSN(), "REDIS_URL="+rs.URL())
	relay := func(args ...string) *exec.Cmd {
		c := exec.Command(bin, args...)
		c.Env = env
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		return c
	}

	step("relay schema --apply")
	if err := relay("schema", "--apply").Run(); err != nil {
		return err
	}

	step("an application writes three events, each in its own transaction")
	conn, err := pgx.Connect(ctx, pg.DSN())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	for i, email := range []string{"ada@example.com", "grace@example.com", "edsger@example.com"} {
		payload := fmt.Sprintf(`{"order_id": "%d", "customer_email": "%s", "amount": "19.99"}`, 1001+i, email)
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('order_created', $1)`, payload); err != nil {
			return err
		}
	}
	step("relay backlog (nothing relayed yet)")
	if err := relay("backlog").Run(); err != nil {
		return err
	}

	step("relay run --stream jobs (stopped with SIGTERM once the stream holds the events)")
	runCmd := relay("run", "--stream", "jobs", "--log-format", "text", "--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	if err := runCmd.Start(); err != nil {
		return err
	}
	rdb := redis.NewClient(must(redis.ParseURL(rs.URL())))
	defer func() { _ = rdb.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for n := int64(0); n < 3 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n, _ = rdb.XLen(ctx, "jobs").Result()
	}
	_ = runCmd.Process.Signal(syscall.SIGTERM)
	if err := runCmd.Wait(); err != nil {
		return fmt.Errorf("relay run: %w", err)
	}

	step("XRANGE jobs - +")
	entries, err := rdb.XRange(ctx, "jobs", "-", "+").Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		var b bytes.Buffer
		for _, k := range []string{"event_id", "event_type", "payload"} {
			fmt.Fprintf(&b, "  %s=%v", k, e.Values[k])
		}
		fmt.Printf("%s%s\n", e.ID, b.String())
	}
	step("relay backlog (drained)")
	if err := relay("backlog").Run(); err != nil {
		return err
	}
	if len(entries) != 3 {
		return fmt.Errorf("expected 3 stream entries, found %d", len(entries))
	}
	fmt.Println("\nThe demo's PostgreSQL and Redis are stopped and removed now.")
	return nil
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
