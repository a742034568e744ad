package main

// These are black-box tests of the relay program: TestMain builds it once, and
// every test runs the binary as a Deployment or CronJob would, with
// DATABASE_URL and REDIS_URL in its environment, against the real PostgreSQL
// and Redis servers of internal/testenv.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// relayBin is the path that execs the relay binary built by TestMain.
var relayBin string

// relayFile keeps the built binary open for the life of the test process;
// relayBin names it through /proc/self/fd.
var relayFile *os.File

func TestMain(m *testing.M) {
	bin, err := buildRelay()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the relay binary: %v\n", err)
		os.Exit(2)
	}
	relayBin = bin
	testenv.Main(m)
}

// buildRelay builds this package (go test runs in its directory) into a temp
// dir, opens the binary and removes the dir again. The open descriptor keeps
// the file alive, and each test execs it as /proc/self/fd/N, which is how
// fexecve works on Linux: nothing is left behind in the temp dir, whether the
// tests pass, fail or are killed (testenv.Main ends the process with os.Exit,
// so no code runs after the tests).
func buildRelay() (string, error) {
	dir, err := os.MkdirTemp("", "relay-cli-test-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	out := filepath.Join(dir, "relay")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if msg, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, msg)
	}
	f, err := os.Open(out)
	if err != nil {
		return "", err
	}
	relayFile = f
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd()), nil
}

// relayEnv is the environment of a relay process: this process's, without
// anything that could configure the relay or libpq behind the test's back
// (DATABASE_URL, REDIS_URL, RELAY_*, PG*), plus kv ("NAME=value").
func relayEnv(kv ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if name == "DATABASE_URL" || name == "REDIS_URL" ||
			strings.HasPrefix(name, "RELAY_") || strings.HasPrefix(name, "PG") {
			continue
		}
		env = append(env, e)
	}
	return append(env, kv...)
}

// relayProc is a running (or finished) relay process.
type relayProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	started        time.Time
	done           chan struct{} // closed when the process has exited
	waitErr        error         // set before done is closed
	ended          time.Time     // set before done is closed
}

// startRelay starts the relay binary with env and args. The process is
// killed, if still running, when the test ends, and its output is logged
// when the test failed.
func startRelay(t *testing.T, env []string, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = &exec.Cmd{
		Path:   relayBin,
		Args:   append([]string{"relay"}, args...),
		Env:    env,
		Stdout: p.stdout,
		Stderr: p.stderr,
		// Killed with the test binary, should that die first.
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting relay %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("relay (pid %d) did not exit within 10s of SIGKILL", p.cmd.Process.Pid)
			}
		}
		// A relay built with -race reports races on stderr (and exits 66).
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("data race in the relay binary:\n%s", p.stderr)
		}
		if t.Failed() {
			t.Logf("relay %s\n--- stdout:\n%s--- stderr:\n%s", strings.Join(args, " "), p.stdout, p.stderr)
		}
	})
	return p
}

func (p *relayProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process.
func (p *relayProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling relay: %v (exited: %v)", err, p.exited())
	}
}

// wait waits at most timeout for the process to exit and returns its exit
// code; the test fails when it does not exit in time.
func (p *relayProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("relay did not exit within %s\n--- stderr:\n%s", timeout, p.stderr)
	}
	return exitCode(t, p.waitErr)
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("waiting for relay: %v", err)
	}
	if exitErr.ExitCode() < 0 {
		t.Fatalf("relay was killed by a signal: %v", err)
	}
	return exitErr.ExitCode()
}

// result is what a relay command that ran to its end did.
type result struct {
	code           int
	stdout, stderr string
}

// runTimeout bounds every relay command expected to finish on its own.
const runTimeout = 60 * time.Second

// execRelay runs the relay binary to its end, at most runTimeout.
func execRelay(t *testing.T, env []string, args ...string) result {
	t.Helper()
	p := startRelay(t, env, args...)
	code := p.wait(t, runTimeout)
	return result{code: code, stdout: p.stdout.String(), stderr: p.stderr.String()}
}

// requireSuccess runs the relay and requires exit code 0.
func requireSuccess(t *testing.T, env []string, args ...string) result {
	t.Helper()
	res := execRelay(t, env, args...)
	if res.code != 0 {
		t.Fatalf("relay %s: exit code %d\n--- stdout:\n%s--- stderr:\n%s",
			strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res
}
