package node

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// ExecPod is the wrapper every container process starts through (the
// `localcluster podexec` command): it enters the pod's network namespace, makes
// a private mount and UTS namespace with the pod's /etc/hosts, /run (where the
// service-account token lives) and hostname, drops to the container's user and
// execs the container's binary, so that the pid the node recorded is the
// container's.
//
//	localcluster podexec --netns PATH --hosts FILE --run DIR --hostname NAME --uid N --gid N --dir DIR -- BINARY ARGS...
func ExecPod(args []string) error {
	fs := flag.NewFlagSet("podexec", flag.ContinueOnError)
	nsPath := fs.String("netns", "", "network namespace to enter")
	hosts := fs.String("hosts", "", "file bind-mounted over /etc/hosts")
	runDir := fs.String("run", "", "dir bind-mounted over /run")
	hostname := fs.String("hostname", "", "hostname of the pod")
	uid := fs.Int("uid", 0, "user to run as")
	gid := fs.Int("gid", 0, "group to run as")
	dir := fs.String("dir", "/", "working directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return errors.New("podexec: no command")
	}
	// Namespaces and credentials below are per thread until execve, which
	// keeps only this thread.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	if *nsPath != "" {
		fd, err := unix.Open(*nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening %s: %w", *nsPath, err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("entering %s: %w", *nsPath, err)
		}
		_ = unix.Close(fd)
	}
	if *hostname != "" {
		if err := unix.Sethostname([]byte(*hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if *hosts != "" {
		if err := unix.Mount(*hosts, "/etc/hosts", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mounting %s on /etc/hosts: %w", *hosts, err)
		}
	}
	if *runDir != "" {
		if err := unix.Mount(*runDir, "/run", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mounting %s on /run: %w", *runDir, err)
		}
	}
	if err := os.Chdir(*dir); err != nil {
		return fmt.Errorf("chdir %s: %w", *dir, err)
	}
	// Raw syscalls: only this thread's credentials, which execve keeps.
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(*gid), uintptr(*gid), uintptr(*gid)); e != 0 {
		return fmt.Errorf("setresgid %d: %w", *gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(*uid), uintptr(*uid), uintptr(*uid)); e != 0 {
		return fmt.Errorf("setresuid %d: %w", *uid, e)
	}
	err := unix.Exec(argv[0], argv, os.Environ())
	return fmt.Errorf("exec %s (as uid %s): %w", argv[0], strconv.Itoa(*uid), err)
}
