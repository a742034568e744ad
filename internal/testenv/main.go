package testenv

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
)

// Environment variables read by this package.
const (
	// EnvDatabaseURL points [Postgres] at an existing server instead of starting one.
	EnvDatabaseURL = "OUTBOX_TEST_DATABASE_URL"
	// EnvRedisURL points [Redis] at an existing server instead of starting one.
	EnvRedisURL = "OUTBOX_TEST_REDIS_URL"
)

// installHint is the fix quoted whenever a server binary is missing.
const installHint = "run hack/install-test-deps.sh (or: apt-get install -y postgresql redis-server)"

// mainStarted records that the test binary runs through Main, which is what stops
// the shared servers; without it they would outlive the tests.
var mainStarted atomic.Bool

// Main runs the package's tests and then stops every shared server this process
// started, and removes their temp dirs. Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Main installs no signal handler (tests may signal their own process). When the
// test binary dies instead (Ctrl-C, -timeout), the kernel signals its servers
// (Pdeathsig) so that none keeps running, and the next test binary that uses this
// package removes the temp dirs left behind.
func Main(m *testing.M) {
	mainStarted.Store(true)
	code := m.Run()
	if err := stopAll(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	sweepStaleDirs()
	os.Exit(code)
}

// closer is a server with a temp dir: close stops it by pid and removes the dir.
type closer interface {
	close() error
}

// live holds every server this process started and has not closed yet, so that
// Main can stop them all.
var live = struct {
	sync.Mutex
	closed  bool // set once Main has stopped everything; later starts fail
	servers map[closer]struct{}
}{servers: map[closer]struct{}{}}

var errStopped = errors.New("testenv.Main has stopped every server: the tests have finished")

func register(c closer) error {
	live.Lock()
	defer live.Unlock()
	if live.closed {
		return errStopped
	}
	live.servers[c] = struct{}{}
	return nil
}

func unregister(c closer) {
	live.Lock()
	defer live.Unlock()
	delete(live.servers, c)
}

// stopAll closes every live server, the shared ones and any dedicated one whose
// test cleanup has not run.
func stopAll() error {
	live.Lock()
	live.closed = true
	servers := make([]closer, 0, len(live.servers))
	for c := range live.servers {
		servers = append(servers, c)
	}
	live.Unlock()

	errs := make([]error, 0, len(servers))
	for _, c := range servers {
		errs = append(errs, c.close())
	}
	return errors.Join(errs...)
}

// unavailableError says that a server cannot be started on this machine because a
// program or user it needs is missing.
type unavailableError struct {
	what string
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("%s; %s", e.what, installHint)
}

// fail ends the test because err kept a server from being ready: a missing
// dependency skips it, or fails it under CI=true; anything else fails it.
func fail(t testing.TB, err error) {
	t.Helper()
	reportError(t, err, os.Getenv("CI") == "true")
}

func reportError(t testing.TB, err error, ci bool) {
	t.Helper()
	var unavailable *unavailableError
	if errors.As(err, &unavailable) && !ci {
		t.Skipf("testenv: %v", err)
		return
	}
	t.Fatalf("testenv: %v", err)
}

// requireMain fails the test when the binary does not run through Main, which
// stops the shared servers.
func requireMain(t testing.TB, helper string) {
	t.Helper()
	if !mainStarted.Load() {
		t.Fatalf("testenv.%s starts a shared server that only testenv.Main stops; "+
			"add to the package's tests: func TestMain(m *testing.M) { testenv.Main(m) }", helper)
	}
}
