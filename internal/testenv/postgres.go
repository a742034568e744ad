package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgReadyTimeout bounds how long a PostgreSQL server may take to accept
	// connections after it was started.
	pgReadyTimeout = 60 * time.Second
	// pgStopTimeout bounds a fast shutdown before the server is killed.
	pgStopTimeout = 30 * time.Second
	// pgSuperuser is the superuser initdb creates; trust auth needs no password.
	pgSuperuser = "postgres"
	// pgDedicatedDatabase is the database StartPostgres creates on its server.
	pgDedicatedDatabase = "outbox"
)

// The SQL this file runs; %s is a quoted identifier.
const (
	sqlCreateDatabase = `CREATE DATABASE %s`
	sqlDropDatabase   = `DROP DATABASE IF EXISTS %s WITH (FORCE)`
)

// pgServerSettings are passed to every server as -c options: loopback only, and
// durability traded for speed, since the data is thrown away. wal_level=logical
// lets tests read the outbox through logical replication (internal/logical);
// it needs a restart to change, so every server starts with it, and the
// replication slots of tests running in parallel fit in max_replication_slots.
var pgServerSettings = []string{
	"listen_addresses=" + loopbackIP,
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
	"max_connections=200",
	"shared_buffers=32MB",
	"wal_level=logical",
	"max_replication_slots=20",
}

// loopbackIP is where every server listens.
const loopbackIP = "127.0.0.1"

// errPortTaken says that a server could not listen on its port.
var errPortTaken = errors.New("port already in use")

// Postgres returns the DSN (postgres://...) of a new, empty database created for
// this test only. The database lives on a PostgreSQL server shared by the test
// binary and started on first use, or, when OUTBOX_TEST_DATABASE_URL is set, on
// that server (the user in the URL must be allowed to create databases). The
// database is dropped, WITH (FORCE), in t.Cleanup.
//
// The shared server needs [Main] in the package's TestMain, which stops it.
func Postgres(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvDatabaseURL)
	if admin == "" {
		requireMain(t, "Postgres")
		var err error
		if admin, err = sharedPostgres(); err != nil {
			fail(t, err)
			return ""
		}
	}

	name := Name(t)
	dsn, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := execAdmin(admin, sqlCreateDatabase, name); err != nil {
		t.Fatalf("testenv: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := execAdmin(admin, sqlDropDatabase, name); err != nil {
			t.Errorf("testenv: dropping database %s: %v", name, err)
		}
	})
	return dsn
}

// shared holds the servers that Postgres and Redis share, each started once;
// Main stops them (they are in live like every server).
var shared struct {
	pgOnce  sync.Once
	pgAdmin string // DSN of the shared server's "postgres" database
	pgErr   error

	redisOnce sync.Once
	redisURL  string
	redisErr  error
}

// sharedPostgres starts the shared server once and returns its admin DSN; every
// caller gets the same error when it could not start.
func sharedPostgres() (string, error) {
	shared.pgOnce.Do(func() {
		s, err := newPostgresServer()
		if err != nil {
			shared.pgErr = fmt.Errorf("starting the shared PostgreSQL server: %w", err)
			return
		}
		shared.pgAdmin = s.dsn(pgSuperuser)
	})
	return shared.pgAdmin, shared.pgErr
}

// PostgresServer is a PostgreSQL server dedicated to one test, which the test
// may stop and start again, e.g. to see what a relay does while the database is
// down. It runs until the test's cleanup.
type PostgresServer struct {
	srv *pgServer
}

// StartPostgres starts a dedicated PostgreSQL server for this test, with a
// database "outbox" on it (opts as for LaunchPostgres). It is stopped, and
// its data dir removed, in t.Cleanup.
func StartPostgres(t testing.TB, opts ...PostgresOption) *PostgresServer {
	t.Helper()
	s, err := newPostgresServer(opts...)
	if err != nil {
		fail(t, err)
		return nil
	}
	t.Cleanup(func() {
		if err := s.close(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	if err := execAdmin(s.dsn(pgSuperuser), sqlCreateDatabase, pgDedicatedDatabase); err != nil {
		t.Fatalf("testenv: creating database %s: %v", pgDedicatedDatabase, err)
	}
	return &PostgresServer{srv: s}
}

// DSN returns the DSN of the database "outbox" on the server, on 127.0.0.1. It
// stays the same across Stop and Start.
func (s *PostgresServer) DSN() string {
	return s.srv.dsn(pgDedicatedDatabase)
}

// Stop shuts the server down like pg_ctl stop -m fast (SIGINT to its pid:
// sessions are disconnected, then a checkpoint) and returns once it has exited.
// Stopping a stopped server does nothing.
func (s *PostgresServer) Stop(t testing.TB) {
	t.Helper()
	if err := s.srv.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Crash shuts the server down like pg_ctl stop -m immediate (SIGQUIT: no
// checkpoint, crash recovery at the next Start) and returns once it has
// exited. What only a checkpoint writes to disk, such as a replication
// slot's confirmed position, goes back to its last checkpoint; WAL not yet
// flushed (this server runs with synchronous_commit=off) is lost.
func (s *PostgresServer) Crash(t testing.TB) {
	t.Helper()
	if err := s.srv.stopWith(syscall.SIGQUIT); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped server again, on the same port and data dir, and
// returns once it accepts connections.
func (s *PostgresServer) Start(t testing.TB) {
	t.Helper()
	if err := s.srv.restart(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// pgServer is one throwaway PostgreSQL cluster: a temp dir holding the data dir,
// the unix socket and the server log, and the postgres process serving it.
type pgServer struct {
	bin     string // holds initdb and postgres
	as      *runAs // who runs them; nil for the current user
	dir     string
	dataDir string
	logPath string

	// listen and clients widen the server past loopback (LaunchPostgres'
	// options): more addresses to listen on, and a range whose clients log
	// in with a password.
	listen  []string
	clients string
	// settings are more -c options (WithPostgresSetting), after
	// pgServerSettings, which they override.
	settings []string

	mu     sync.Mutex
	port   int
	proc   *process // nil while stopped
	closed bool
}

// newPostgresServer runs initdb into a new temp dir and starts the server on a
// free port. The caller must close it.
func newPostgresServer(opts ...PostgresOption) (*pgServer, error) {
	bin, err := findPostgresBin(postgresBinCandidates())
	if err != nil {
		return nil, err
	}
	as, err := postgresUser()
	if err != nil {
		return nil, err
	}
	uid, gid := as.ids()
	dir, err := makeTempDir("pg", uid, gid)
	if err != nil {
		return nil, err
	}
	s := &pgServer{
		bin:     bin,
		as:      as,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
	}
	for _, o := range opts {
		o(s)
	}
	if err := register(s); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := s.initdb(); err != nil {
		return nil, errors.Join(err, s.close())
	}
	if err := s.startOnFreePort(); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

func (s *pgServer) initdb() error {
	cmd := exec.Command(filepath.Join(s.bin, "initdb"),
		"--pgdata="+s.dataDir,
		"--username="+pgSuperuser,
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
		"--no-sync",
		"--no-instructions",
	)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.as.credential(), Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", s.dataDir, err, indent(string(out)))
	}
	if s.clients == "" {
		return nil
	}
	// initdb trusts loopback only; the wider range must give a password,
	// for a database and for a replication connection (a relay with source
	// LogicalReplication), which "all" does not cover.
	hba, err := os.OpenFile(filepath.Join(s.dataDir, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(hba, "host all all %[1]s scram-sha-256\nhost replication all %[1]s scram-sha-256\n", s.clients)
	return errors.Join(err, hba.Close())
}

// startOnFreePort starts the server, on another free port each time the one it
// got turns out to be taken.
func (s *pgServer) startOnFreePort() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("postgres: server closed while starting")
	}
	return startOnFreePort(&s.port, s.startLocked)
}

// restart starts a stopped server on the port it had, waiting a little for the
// port in case another process grabbed it meanwhile.
func (s *pgServer) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("postgres: server already closed")
	}
	if s.proc != nil {
		return fmt.Errorf("postgres on port %d (pid %d) is running already", s.port, s.proc.pid())
	}
	return restartOnSamePort(s.startLocked)
}

// startLocked starts postgres on s.port and waits until it accepts connections.
func (s *pgServer) startLocked() error {
	offset := logSize(s.logPath)
	args := make([]string, 0, 8+2*(len(pgServerSettings)+len(s.settings)))
	args = append(args, "-D", s.dataDir, "-p", strconv.Itoa(s.port), "-k", s.dir)
	for _, setting := range slices.Concat(pgServerSettings, s.settings) { // a later -c wins
		args = append(args, "-c", setting)
	}
	if len(s.listen) > 0 {
		args = append(args, "-c", "listen_addresses="+strings.Join(append([]string{loopbackIP}, s.listen...), ","))
	}
	// SIGQUIT on the test binary's death: immediate shutdown, the data is thrown away.
	p, err := startProcess(filepath.Join(s.bin, "postgres"), args, s.dir, s.logPath, s.as, syscall.SIGQUIT)
	if err != nil {
		return err
	}
	if err := s.waitReady(p, offset); err != nil {
		return err
	}
	s.proc = p
	return nil
}

// waitReady polls with a connection until the server answers, it exits, or
// pgReadyTimeout passes; then it stops it and quotes its log.
func (s *pgServer) waitReady(p *process, offset int64) error {
	deadline := time.Now().Add(pgReadyTimeout)
	dsn := s.dsn(pgSuperuser)
	for {
		if p.exited() {
			if logSays(s.logPath, offset, "Address already in use") {
				return fmt.Errorf("postgres on port %d: %w", s.port, errPortTaken)
			}
			return fmt.Errorf("postgres on port %d exited while starting (%v); log %s:\n%s",
				s.port, p.err, s.logPath, logTail(s.logPath, offset))
		}
		err := ping(dsn)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			stopErr := p.stop(syscall.SIGQUIT, pgStopTimeout)
			return errors.Join(fmt.Errorf("postgres on port %d not ready after %s: %w; log %s:\n%s",
				s.port, pgReadyTimeout, err, s.logPath, logTail(s.logPath, offset)), stopErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the server down like pg_ctl stop -m fast and waits for its exit.
func (s *pgServer) stop() error { return s.stopWith(syscall.SIGINT) }

// stopWith sends the postmaster sig (SIGINT: a fast shutdown, SIGQUIT: an
// immediate one) and waits for its exit.
func (s *pgServer) stopWith(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(sig)
}

func (s *pgServer) stopLocked(sig syscall.Signal) error {
	if s.proc == nil {
		return nil
	}
	p := s.proc
	s.proc = nil
	if err := p.stop(sig, pgStopTimeout); err != nil {
		return fmt.Errorf("stopping postgres on port %d: %w; log %s:\n%s", s.port, err, s.logPath, logTail(s.logPath, 0))
	}
	return nil
}

// close stops the server and removes its temp dir.
func (s *pgServer) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	defer unregister(s)
	return errors.Join(s.stopLocked(syscall.SIGINT), os.RemoveAll(s.dir))
}

// dsn returns the URL of database db on the server's loopback port.
func (s *pgServer) dsn(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(pgSuperuser),
		Host:     "127.0.0.1:" + strconv.Itoa(s.port),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// ping connects to dsn once.
func ping(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return conn.Ping(ctx)
}

// execAdmin runs one statement, sqlFormat with a quoted identifier, on dsn.
func execAdmin(dsn, sqlFormat, ident string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, fmt.Sprintf(sqlFormat, pgx.Identifier{ident}.Sanitize()))
	return err
}

// withDatabase returns the URL dsn pointing at database db instead.
func withDatabase(dsn, db string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", EnvDatabaseURL)
	}
	u.Path, u.RawPath = "/"+db, ""
	return u.String(), nil
}

// postgresBinCandidates lists where initdb and postgres may be: Debian's
// /usr/lib/postgresql/<version>/bin, newest version first, then PATH.
func postgresBinCandidates() []string {
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return v
	}
	slices.SortFunc(versioned, func(a, b string) int { return version(b) - version(a) })
	return append(versioned, filepath.SplitList(os.Getenv("PATH"))...)
}

// findPostgresBin returns the first of dirs that holds both initdb and postgres.
// A dir of symlinks (as /usr/local/bin may be) is resolved to where they point.
func findPostgresBin(dirs []string) (string, error) {
	for _, dir := range dirs {
		if dir == "" || !isExecutable(filepath.Join(dir, "initdb")) || !isExecutable(filepath.Join(dir, "postgres")) {
			continue
		}
		if real, err := filepath.EvalSymlinks(filepath.Join(dir, "initdb")); err == nil {
			if realDir := filepath.Dir(real); isExecutable(filepath.Join(realDir, "postgres")) {
				return realDir, nil
			}
		}
		return dir, nil
	}
	return "", &unavailableError{what: "PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or PATH"}
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// indent prefixes every line of s with a tab, for quoting output in an error.
func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "\t(no output)"
	}
	return "\t" + strings.ReplaceAll(s, "\n", "\n\t")
}
