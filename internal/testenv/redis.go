package testenv

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// redisReadyTimeout bounds how long a Redis server may take to answer PING
	// after it was started (loading a large AOF counts).
	redisReadyTimeout = 30 * time.Second
	// redisStopTimeout bounds a SIGTERM shutdown before the server is killed.
	redisStopTimeout = 30 * time.Second
)

// Redis returns the URL (redis://127.0.0.1:port/0) of a Redis server shared by the
// test binary and started on first use, or OUTBOX_TEST_REDIS_URL when that is set.
// Tests share it: name keys and streams with [Name].
//
// The shared server needs [Main] in the package's TestMain, which stops it.
func Redis(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvRedisURL); u != "" {
		return u
	}
	requireMain(t, "Redis")
	shared.redisOnce.Do(func() {
		s, err := newRedisServer(redisConfig{})
		if err != nil {
			shared.redisErr = fmt.Errorf("starting the shared Redis server: %w", err)
			return
		}
		shared.redisURL = s.url()
	})
	if shared.redisErr != nil {
		fail(t, shared.redisErr)
		return ""
	}
	return shared.redisURL
}

// RedisOption configures a server started by [StartRedis].
type RedisOption func(*redisConfig)

type redisConfig struct {
	appendOnly bool
	// extraArgs are more config directives (--name value ...), see WithRedisArgs.
	extraArgs []string
	// tls serves TLS only, with these files (see WithTLS).
	tls *TLSFiles
	// sentinelConf runs the server in sentinel mode with this config file,
	// written into the server's dir (see StartSentinelSet).
	sentinelConf string
}

// WithAppendOnly turns on the append-only file (fsync on every write), so that
// the data survives Stop and Start.
func WithAppendOnly() RedisOption {
	return func(c *redisConfig) { c.appendOnly = true }
}

// RedisServer is a Redis server dedicated to one test, which the test may stop
// and start again. It runs until the test's cleanup.
type RedisServer struct {
	srv *redisServer
}

// StartRedis starts a dedicated Redis server for this test. It is stopped, and
// its dir removed, in t.Cleanup. Without [WithAppendOnly] it keeps nothing across
// Stop and Start.
func StartRedis(t testing.TB, opts ...RedisOption) *RedisServer {
	t.Helper()
	var cfg redisConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	s, err := newRedisServer(cfg)
	if err != nil {
		fail(t, err)
		return nil
	}
	t.Cleanup(func() {
		if err := s.close(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return &RedisServer{srv: s}
}

// URL returns redis://127.0.0.1:port/0. It stays the same across Stop and Start.
func (s *RedisServer) URL() string {
	return s.srv.url()
}

// Stop sends SIGTERM to the server's pid and returns once it has exited.
// Stopping a stopped server does nothing.
func (s *RedisServer) Stop(t testing.TB) {
	t.Helper()
	if err := s.srv.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped server again, on the same port and dir, and returns
// once it answers PING (after loading its append-only file, if any).
func (s *RedisServer) Start(t testing.TB) {
	t.Helper()
	if err := s.srv.restart(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// redisServer is one throwaway redis-server process and its temp dir.
type redisServer struct {
	bin     string
	cfg     redisConfig
	dir     string
	logPath string

	mu     sync.Mutex
	port   int
	proc   *process // nil while stopped
	closed bool
}

// newRedisServer starts redis-server in a new temp dir on a free port. The
// caller must close it.
func newRedisServer(cfg redisConfig) (*redisServer, error) {
	bin, err := findRedisServer()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("redis", -1, -1)
	if err != nil {
		return nil, err
	}
	s := &redisServer{bin: bin, cfg: cfg, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	if err := register(s); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := s.startOnFreePort(); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

func findRedisServer() (string, error) {
	if path, err := exec.LookPath("redis-server"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if isExecutable(path) {
			return path, nil
		}
	}
	return "", &unavailableError{what: "redis-server not found in PATH"}
}

func (s *redisServer) startOnFreePort() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redis: server closed while starting")
	}
	return startOnFreePort(&s.port, s.startLocked)
}

func (s *redisServer) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redis: server already closed")
	}
	if s.proc != nil {
		return fmt.Errorf("redis on port %d (pid %d) is running already", s.port, s.proc.pid())
	}
	return restartOnSamePort(s.startLocked)
}

// startLocked starts redis-server on s.port and waits until it answers PING.
func (s *redisServer) startLocked() error {
	offset := logSize(s.logPath)
	var args []string
	if s.cfg.sentinelConf != "" {
		conf := filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(s.cfg.sentinelConf), 0o600); err != nil {
			return fmt.Errorf("writing sentinel config: %w", err)
		}
		args = append(args, conf, "--sentinel")
	}
	args = append(args, s.portArgs()...)
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--daemonize", "no",
		"--logfile", "", // stdout, which goes to the log file
	)
	if s.cfg.appendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, s.cfg.extraArgs...)
	p, err := startProcess(s.bin, args, s.dir, s.logPath, nil, syscall.SIGKILL)
	if err != nil {
		return err
	}
	if err := s.waitReady(p, offset); err != nil {
		return err
	}
	s.proc = p
	return nil
}

func (s *redisServer) waitReady(p *process, offset int64) error {
	deadline := time.Now().Add(redisReadyTimeout)
	addr := "127.0.0.1:" + strconv.Itoa(s.port)
	for {
		if p.exited() {
			if logSays(s.logPath, offset, "Address already in use") {
				return fmt.Errorf("redis on port %d: %w", s.port, errPortTaken)
			}
			return fmt.Errorf("redis on port %d exited while starting (%v); log %s:\n%s",
				s.port, p.err, s.logPath, logTail(s.logPath, offset))
		}
		err := redisPing(addr, s.cfg.tls != nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			stopErr := p.stop(syscall.SIGKILL, redisStopTimeout)
			return errors.Join(fmt.Errorf("redis on port %d not ready after %s: %w; log %s:\n%s",
				s.port, redisReadyTimeout, err, s.logPath, logTail(s.logPath, offset)), stopErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisPing sends PING and expects +PONG (a loading server answers -LOADING).
func redisPing(addr string, useTLS bool) error {
	var conn net.Conn
	var err error
	if useTLS {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second},
			Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a readiness probe of the test's own server
		conn, err = d.Dial("tcp", addr)
	} else {
		conn, err = net.DialTimeout("tcp", addr, time.Second)
	}
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	// A server that requires a password (requirepass, ACL) is up too.
	if reply = strings.TrimSpace(reply); reply != "+PONG" && !strings.HasPrefix(reply, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", reply)
	}
	return nil
}

func (s *redisServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *redisServer) stopLocked() error {
	if s.proc == nil {
		return nil
	}
	p := s.proc
	s.proc = nil
	if err := p.stop(syscall.SIGTERM, redisStopTimeout); err != nil {
		return fmt.Errorf("stopping redis on port %d: %w; log %s:\n%s", s.port, err, s.logPath, logTail(s.logPath, 0))
	}
	return nil
}

// close stops the server and removes its temp dir.
func (s *redisServer) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	defer unregister(s)
	return errors.Join(s.stopLocked(), os.RemoveAll(s.dir))
}

func (s *redisServer) url() string {
	scheme := "redis"
	if s.cfg.tls != nil {
		scheme = "rediss"
	}
	return scheme + "://127.0.0.1:" + strconv.Itoa(s.port) + "/0"
}
