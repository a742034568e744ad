// Package supervise starts the local cluster's long-lived processes detached
// from the caller, records each pid in a file, and stops them by that pid.
//
// A pid file holds the pid and the path of the binary it runs; a process counts
// as alive only when /proc/<pid>/exe still is that binary, so a recycled pid is
// never signalled.
package supervise

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Spec is one process to start.
type Spec struct {
	// Name names the pid file (<pidDir>/<name>.pid) and the log (<logDir>/<name>.log).
	Name string
	Path string
	Args []string
	Env  []string // appended to os.Environ()
	Dir  string
}

// Start runs spec in its own session, with stdout and stderr appended to its
// log, records its pid, and returns without waiting for it.
func Start(spec Spec, pidDir, logDir string) (int, error) {
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return 0, err
	}
	logPath := filepath.Join(logDir, spec.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer func() { _ = logFile.Close() }() // the child keeps its own descriptor
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	pid := cmd.Process.Pid
	if err := WritePidFile(filepath.Join(pidDir, spec.Name+".pid"), pid, spec.Path); err != nil {
		_ = cmd.Process.Kill()
		return 0, err
	}
	// Reap it in the background while this process lives; once this process
	// exits, init adopts it.
	go func() { _ = cmd.Wait() }()
	return pid, nil
}

// WritePidFile records pid and the binary it runs.
func WritePidFile(path string, pid int, binary string) error {
	return os.WriteFile(path, []byte(fmt.Sprintf("%d %s\n", pid, binary)), 0o644)
}

// ReadPidFile returns the pid and binary recorded in path.
func ReadPidFile(path string) (int, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, "", err
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0, "", fmt.Errorf("%s is empty", path)
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	bin := ""
	if len(fields) > 1 {
		bin = fields[1]
	}
	return pid, bin, nil
}

// Alive reports whether pid runs binary (any binary when binary is empty) and
// is not a zombie.
func Alive(pid int, binary string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state is the field after the parenthesised command.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	if binary == "" {
		return true
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	want, err := filepath.EvalSymlinks(binary)
	if err != nil {
		want = binary
	}
	return exe == want || exe == binary
}

// AliveFromFile reports whether the process of a pid file is alive.
func AliveFromFile(path string) (int, bool) {
	pid, bin, err := ReadPidFile(path)
	if err != nil {
		return 0, false
	}
	return pid, Alive(pid, bin)
}

// Stop sends SIGTERM to the process of the pid file, waits up to grace for it to
// exit, then sends SIGKILL; it removes the pid file. A missing file or a dead
// process is not an error.
func Stop(path string, grace time.Duration) error {
	pid, bin, err := ReadPidFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := StopPid(pid, bin, grace); err != nil {
		return err
	}
	return os.Remove(path)
}

// StopPid stops one process (SIGTERM, then SIGKILL after grace) if it is alive
// and runs binary.
func StopPid(pid int, binary string, grace time.Duration) error {
	if !Alive(pid, binary) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %d: %w", pid, err)
	}
	if WaitExit(pid, binary, grace) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %d: %w", pid, err)
	}
	if !WaitExit(pid, binary, 10*time.Second) {
		return fmt.Errorf("process %d (%s) survived SIGKILL", pid, binary)
	}
	return nil
}

// WaitExit polls until pid is gone, up to timeout, and reports whether it is.
func WaitExit(pid int, binary string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !Alive(pid, binary) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
