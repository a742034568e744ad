package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// dirPrefix names the temp dirs of this package's servers, so that sweepStaleDirs
// can find the ones a killed test binary left behind.
const dirPrefix = "outbox-testenv-"

// ownerFile holds, in each temp dir, the pid of the test binary that made it.
const ownerFile = "owner.pid"

// makeTempDir creates a temp dir for one server, owned by uid/gid when they are
// not -1. Its path stays short: PostgreSQL puts its unix socket there, and socket
// paths are limited to about 100 bytes.
func makeTempDir(kind string, uid, gid int) (string, error) {
	sweepOnce.Do(sweepStaleDirs)

	base := os.TempDir()
	if len(base) > 60 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, dirPrefix+kind+"-")
	if err != nil {
		return "", fmt.Errorf("creating temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("creating temp dir: %w", err)
	}
	if uid != -1 {
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("creating temp dir: %w", err)
		}
	}
	return dir, nil
}

var sweepOnce sync.Once

// sweepStaleDirs removes the temp dirs of test binaries that no longer run (killed
// by a timeout, say). Their servers are gone already: each server gets a signal
// from the kernel when the test binary dies (Pdeathsig).
func sweepStaleDirs() {
	for _, base := range []string{os.TempDir(), "/tmp"} {
		dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
		for _, dir := range dirs {
			raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
			if err != nil {
				continue // being created, or not ours
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil || pid <= 0 || pid == os.Getpid() {
				continue
			}
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				_ = os.RemoveAll(dir)
			}
		}
	}
}

// handedOut remembers the ports this process chose, so that two servers starting
// at the same moment never try the same one.
var handedOut sync.Map

// freePort returns a loopback port that nothing listened on a moment ago.
// Callers retry with another port when the server then finds it taken.
func freePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken {
			return port, nil
		}
	}
	return 0, errors.New("finding a free port: no new port after 50 tries")
}

// startOnFreePort sets *port to a free port and calls start, up to five times:
// on another free port each time start finds its port taken (errPortTaken).
func startOnFreePort(port *int, start func() error) error {
	var err error
	for range 5 {
		if *port, err = freePort(); err != nil {
			return err
		}
		if err = start(); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}

// restartOnSamePort calls start up to ten times, half a second apart, while it
// finds its port taken, in case another process grabbed the port meanwhile.
func restartOnSamePort(start func() error) error {
	var err error
	for range 10 {
		if err = start(); !errors.Is(err, errPortTaken) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// runAs is the user a server runs as: the current one (nil), or, when the tests
// run as root, the "postgres" user, because initdb and postgres refuse root.
type runAs struct {
	uid, gid uint32
}

func (r *runAs) ids() (int, int) {
	if r == nil {
		return -1, -1
	}
	return int(r.uid), int(r.gid)
}

func (r *runAs) credential() *syscall.Credential {
	if r == nil {
		return nil
	}
	return &syscall.Credential{Uid: r.uid, Gid: r.gid}
}

// postgresUser returns who runs PostgreSQL: nil (this user) unless root.
func postgresUser() (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, &unavailableError{what: `running as root, and there is no "postgres" user to run PostgreSQL as (initdb refuses root)`}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: gid %q: %w", u.Gid, err)
	}
	return &runAs{uid: uint32(uid), gid: uint32(gid)}, nil
}

// process is a server process started by this package and waited for by it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, set before done is closed
}

// startProcess starts name with args, its output appended to logPath. The
// process gets its own process group and is sent deathSig when this process
// dies, so that a killed test binary does not leave servers running.
func startProcess(name string, args []string, dir, logPath string, as *runAs, deathSig syscall.Signal) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log: %w", err)
	}
	defer func() { _ = logFile.Close() }() // the child keeps its own descriptor
	if uid, gid := as.ids(); uid != -1 {
		_ = logFile.Chown(uid, gid)
	}

	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  deathSig,
		Credential: as.credential(),
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(name), err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process and waits for it to exit. After grace it kills
// the whole process group and reports that it had to.
//
//nolint:unparam // each server passes its own timeout (pgStopTimeout, redisStopTimeout), equal today.
func (p *process) stop(sig syscall.Signal, grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	// A process stopped by SIGSTOP (RedisServer.Freeze) acts on sig only
	// once it runs again.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("pid %d did not exit within %s of %v; killed it", p.pid(), grace, sig)
}

// logSize returns the current size of a log, to read what a start adds to it.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logTail returns the last lines of what was written to path from offset on,
// indented for quoting in an error.
func logTail(path string, offset int64) string {
	const maxBytes, maxLines = 8 << 10, 40
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("\t(no log: %v)", err)
	}
	defer func() { _ = f.Close() }()
	size := logSize(path)
	if size-offset > maxBytes {
		offset = size - maxBytes
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Sprintf("\t(reading log: %v)", err)
	}
	raw, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "\t(log is empty)"
	}
	return "\t" + strings.Join(lines, "\n\t")
}

// logSays reports whether what was written to path from offset on contains s.
func logSays(path string, offset int64, s string) bool {
	raw, err := os.ReadFile(path)
	if err != nil || int64(len(raw)) < offset {
		return false
	}
	return bytes.Contains(raw[offset:], []byte(s))
}
