//go:build faults

package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// startTimeout bounds how long a relay may take to serve /healthz.
const startTimeout = 30 * time.Second

// relayEnv are the connection strings a relay reads from its environment.
type relayEnv struct {
	databaseURL, redisURL string
}

// caseEnv is the relays' environment on a case's own servers, and the
// case's stream name, once the default schema is applied.
func caseEnv(t testing.TB, pg *testenv.PostgresServer, rs *testenv.RedisServer) (relayEnv, string) {
	t.Helper()
	env := relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}
	mustRelay(t, env, "schema", "--apply")
	return env, testenv.Name(t)
}

// environ is this process's environment without RELAY_* (which would set
// flags) plus the two connection strings.
func (e relayEnv) environ() []string {
	env := []string{"DATABASE_URL=" + e.databaseURL, "REDIS_URL=" + e.redisURL}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

// relayProc is one `relay run` process. Its output goes to a buffer that
// the test's cleanup prints when the test failed.
type relayProc struct {
	name                   string
	cmd                    *exec.Cmd
	out                    syncbuf.Buffer
	done                   chan struct{} // closed when the process has exited
	waitErr                error         // set before done is closed
	metricsAddr, probeAddr string
}

// handedOut remembers the ports given to this process's relays, so that two
// relays starting at the same moment never get the same one.
var handedOut sync.Map

// freeAddr returns 127.0.0.1:port for a port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
	t.Fatal("no new free port after 50 tries")
	return ""
}

// startRelay starts `relay run args...` with metrics and probes on free
// loopback ports and returns once /healthz answers. It is stopped (SIGKILL)
// in the test's cleanup if still running then.
func startRelay(t testing.TB, name string, env relayEnv, args ...string) *relayProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := &relayProc{name: name, metricsAddr: freeAddr(t), probeAddr: freeAddr(t), done: make(chan struct{})}
		all := append([]string{"run", "--log-format=text",
			"--metrics-bind-address=" + p.metricsAddr,
			"--health-probe-bind-address=" + p.probeAddr,
		}, args...)
		p.cmd = exec.Command(relayBin, all...)
		p.cmd.Env = env.environ()
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		// The relay dies with the test binary, whatever kills it.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		require.NoError(t, p.cmd.Start(), "starting relay %s", name)
		go func() {
			p.waitErr = p.cmd.Wait()
			close(p.done)
		}()
		t.Cleanup(func() {
			if !p.exited() {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
			if t.Failed() {
				t.Logf("--- relay %s (pid %d, exit: %v) output:\n%s", p.name, p.cmd.Process.Pid, p.waitErr, tail(p.out.String(), 16<<10))
			}
		})
		err := p.waitHealthy()
		if err == nil {
			return p
		}
		if p.exited() && strings.Contains(p.out.String(), "address already in use") && attempt < 3 {
			continue
		}
		t.Fatalf("relay %s: %v\n%s", name, err, tail(p.out.String(), 16<<10))
	}
}

func (p *relayProc) waitHealthy() error {
	deadline := time.Now().Add(startTimeout)
	for {
		if p.exited() {
			return fmt.Errorf("exited while starting: %v", p.waitErr)
		}
		if code, _ := httpGet("http://" + p.probeAddr + "/healthz"); code == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/healthz did not answer within %s", startTimeout)
		}
		time.Sleep(pollInterval)
	}
}

func (p *relayProc) pid() int { return p.cmd.Process.Pid }

func (p *relayProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the relay's pid.
func (p *relayProc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig), "signal %s to relay %s", sig, p.name)
}

// wait waits for the process to exit.
func (p *relayProc) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(timeout):
		t.Fatalf("relay %s (pid %d) did not exit within %s", p.name, p.pid(), timeout)
		return nil
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *relayProc) kill(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	_ = p.wait(t, 10*time.Second)
}

// stop sends SIGTERM and requires a clean exit: the relay finishes or rolls
// back the batches in flight, then exits 0.
func (p *relayProc) stop(t testing.TB, timeout time.Duration) { //nolint:unparam // a case may wait longer
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	require.NoError(t, p.wait(t, timeout), "relay %s after SIGTERM", p.name)
}

// metric returns the value of one sample of /metrics (0 when absent or
// unreachable), e.g. outbox_relay_events_published_total.
func (p *relayProc) metric(sample string) float64 {
	code, body := httpGet("http://" + p.metricsAddr + "/metrics")
	if code != http.StatusOK {
		return 0
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// published is the relay's outbox_relay_events_published_total.
func (p *relayProc) published() float64 { return p.metric("outbox_relay_events_published_total") }

var httpClient = &http.Client{Timeout: 5 * time.Second}

// httpGet returns the status code and body of a GET; 0 when unreachable.
func httpGet(url string) (int, string) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// relayCommand runs a one-shot relay subcommand (backlog, cleanup,
// dead-letters, schema) and returns its stdout and stderr.
func relayCommand(ctx context.Context, env relayEnv, args ...string) (stdout, stderr string, err error) {
	stdout, stderr, _, err = relayCommandPeak(ctx, env, args...)
	return stdout, stderr, err
}

// relayCommandPeak is relayCommand that also returns the command's peak
// resident memory in MiB (its rusage; 0 when it did not start).
func relayCommandPeak(ctx context.Context, env relayEnv, args ...string) (stdout, stderr string, peakMiB float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Env = env.environ()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("relay %s: %w\n%s", strings.Join(args, " "), err, errOut.String())
	}
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			peakMiB = float64(ru.Maxrss) / 1024 // kB on Linux
		}
	}
	return out.String(), errOut.String(), peakMiB, err
}

// mustRelay runs a one-shot subcommand that must succeed and returns its stdout.
func mustRelay(t testing.TB, env relayEnv, args ...string) string {
	t.Helper()
	out, _, err := relayCommand(t.Context(), env, args...)
	require.NoError(t, err)
	return out
}

// backlogJSON is the output of `relay backlog --output json`.
type backlogJSON struct {
	Count       int  `json:"count"`
	DeadLetters *int `json:"deadLetters"` // absent before dead-letter tables
}

// backlog runs `relay backlog --output json` for table.
func backlog(t testing.TB, env relayEnv, table string) backlogJSON {
	t.Helper()
	var b backlogJSON
	out := mustRelay(t, env, "backlog", "--table", table, "--output", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &b), "relay backlog --output json: %s", out)
	return b
}

// runHelpLists reports whether `relay run --help` lists flag.
func runHelpLists(t testing.TB, flag string) bool {
	t.Helper()
	out, _, err := relayCommand(t.Context(), relayEnv{}, "run", "--help")
	require.NoError(t, err)
	return strings.Contains(out, flag+" ")
}

// tcpPortsTo returns the local ports of the relay's TCP connections to
// remotePort on loopback, read from /proc: with pg_stat_activity.client_port
// they name the relay's PostgreSQL sessions.
func (p *relayProc) tcpPortsTo(remotePort int) ([]int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid()))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid(), fd.Name()))
		if err != nil {
			continue
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", p.pid(), table))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			local, remote := hexPort(f[1]), hexPort(f[2])
			if remote == remotePort && local > 0 {
				ports = append(ports, local)
			}
		}
	}
	return ports, nil
}

// hexPort parses the port of a /proc/net/tcp address, "0100007F:1F90".
func hexPort(addr string) int {
	_, port, ok := strings.Cut(addr, ":")
	if !ok {
		return 0
	}
	v, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return 0
	}
	return int(v)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// proxiedRelays starts relays named prefix1, prefix2, ..., each reaching
// Redis through a proxy of its own, so that one relay's link alone can be
// slowed or fail; all keeps every relay started, for the logs.
type proxiedRelays struct {
	t       testing.TB
	env     relayEnv
	prefix  string
	args    []string
	proxies map[*relayProc]*proxy
	all     []*relayProc
}

func newProxiedRelays(t testing.TB, env relayEnv, prefix string, args ...string) *proxiedRelays {
	return &proxiedRelays{t: t, env: env, prefix: prefix, args: args, proxies: map[*relayProc]*proxy{}}
}

// start starts the next relay and waits until it is healthy.
func (p *proxiedRelays) start() *relayProc {
	p.t.Helper()
	name := fmt.Sprintf("%s%d", p.prefix, len(p.all)+1)
	x := startProxy(p.t, "redis-"+name, hostPort(p.t, p.env.redisURL))
	env := p.env
	env.redisURL = withHost(p.t, p.env.redisURL, x.addr())
	r := startRelay(p.t, name, env, p.args...)
	p.proxies[r] = x
	p.all = append(p.all, r)
	return r
}
