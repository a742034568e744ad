package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/netns"
	"github.com/outbox-dev/outbox-operator/test/localcluster/podspec"
	"github.com/outbox-dev/outbox-operator/test/localcluster/supervise"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podRun is one pod on this node: its sandbox (network namespace, files) and
// the processes of its containers.
type podRun struct {
	p   *Provider
	key string
	id  string // 8 hex digits of the UID: names the namespace and veth
	dir string

	ctx    context.Context
	cancel context.CancelFunc // cancelled when the pod is being deleted
	done   chan struct{}      // closed when every process stopped and the sandbox is gone

	mu           sync.Mutex
	pod          *corev1.Pod
	ip           string
	sandboxReady bool
	startTime    *metav1.Time
	initStatuses []corev1.ContainerStatus
	statuses     []corev1.ContainerStatus
	failReason   string
	failMessage  string
	finished     bool
	procs        map[string]*os.Process
	grace        time.Duration
}

func (r *podRun) logf(msg string, args ...any) {
	r.p.log.Info(msg, append([]any{"pod", r.key}, args...)...)
}

// snapshot returns the pod with its current status.
func (r *podRun) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snapshotLocked()
}

func (r *podRun) snapshotLocked() *corev1.Pod {
	pod := r.pod.DeepCopy()
	st := &pod.Status
	st.HostIP = r.p.hostIP
	st.HostIPs = []corev1.HostIP{{IP: r.p.hostIP}}
	if r.ip != "" {
		st.PodIP = r.ip
		st.PodIPs = []corev1.PodIP{{IP: r.ip}}
	}
	st.StartTime = r.startTime
	st.InitContainerStatuses = cloneStatuses(r.initStatuses)
	st.ContainerStatuses = cloneStatuses(r.statuses)
	st.QOSClass = qosClass(pod)
	if r.failReason != "" {
		st.Phase = corev1.PodFailed
		st.Reason, st.Message = r.failReason, r.failMessage
	} else {
		st.Phase = podspec.Phase(&pod.Spec, r.initStatuses, r.statuses)
	}
	st.Conditions = podspec.Conditions(st.Phase, r.sandboxReady, r.initStatuses, r.statuses, r.pod.Status.Conditions, metav1.Now())
	r.pod.Status.Conditions = st.Conditions
	return pod
}

func cloneStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	for _, c := range pod.Spec.Containers {
		if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 {
			return corev1.PodQOSBurstable
		}
	}
	return corev1.PodQOSBestEffort
}

// notify pushes the current status to the pod controller.
func (r *podRun) notify() { r.p.notifyPod(r.snapshot()) }

func (r *podRun) setStatus(init bool, i int, fn func(*corev1.ContainerStatus)) {
	r.mu.Lock()
	if init {
		fn(&r.initStatuses[i])
	} else {
		fn(&r.statuses[i])
	}
	r.mu.Unlock()
	r.notify()
}

func initialStatuses(cs []corev1.Container, image func(string) string) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, len(cs))
	for i, c := range cs {
		out[i] = corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: image(c.Image),
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
		}
	}
	return out
}

// run is the pod's life: sandbox, init containers, containers, teardown.
func (r *podRun) run() {
	defer close(r.done)
	defer r.teardown()
	if err := r.setupSandbox(); err != nil {
		r.logf("Setting up the pod sandbox failed", "err", err)
		r.mu.Lock()
		r.failReason, r.failMessage = "SandboxFailed", err.Error()
		r.markAllTerminated("SandboxFailed", err.Error())
		r.mu.Unlock()
		return
	}
	spec := &r.pod.Spec
	for i := range spec.InitContainers {
		if !r.runContainer(true, i) {
			return
		}
	}
	var wg sync.WaitGroup
	for i := range spec.Containers {
		wg.Go(func() { r.runContainer(false, i) })
	}
	wg.Wait()
}

// markAllTerminated gives every container that has not run a terminal state.
func (r *podRun) markAllTerminated(reason, msg string) {
	now := metav1.Now()
	for _, list := range [][]corev1.ContainerStatus{r.initStatuses, r.statuses} {
		for i := range list {
			if list[i].State.Terminated == nil {
				list[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 128, Reason: reason, Message: msg, StartedAt: now, FinishedAt: now}}
				list[i].Ready = false
			}
		}
	}
}

func (r *podRun) setupSandbox() error {
	r.mu.Lock()
	now := metav1.Now()
	r.startTime = &now
	r.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(r.dir, "run"), 0o755); err != nil {
		return err
	}
	ip, err := r.p.ipam.allocate(r.key)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.ip = ip
	r.mu.Unlock()
	if err := netns.Create(r.p.network, r.id, ip); err != nil {
		return err
	}
	if err := r.writeVolumes(); err != nil {
		return err
	}
	r.p.proxy.addPod(r.key, r.pod.Namespace, filepath.Join(r.dir, "hosts"), ip, r.pod.Name)
	r.mu.Lock()
	r.sandboxReady = true
	r.mu.Unlock()
	r.logf("Started the pod sandbox", "ip", ip, "netns", r.p.network.Name(r.id))
	r.notify()
	return nil
}

// writeVolumes writes the pod's volumes. Like the kubelet, it waits for a
// ConfigMap or Secret that does not exist yet (kube-root-ca.crt appears in a
// new namespace a moment after the namespace itself) instead of failing the
// pod, until the pod is deleted.
func (r *podRun) writeVolumes() error {
	delay := 100 * time.Millisecond
	for {
		err := r.p.writeVolumes(r.ctx, r.pod, filepath.Join(r.dir, "run"))
		if err == nil || !apierrors.IsNotFound(err) {
			return err
		}
		r.logf("Waiting for a volume source", "err", err)
		select {
		case <-r.ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (r *podRun) teardown() {
	r.p.proxy.removePod(r.key)
	if err := netns.Delete(r.p.network, r.id); err != nil {
		r.logf("Removing the pod's network namespace failed", "err", err)
	}
	r.p.ipam.release(r.key)
	r.mu.Lock()
	r.sandboxReady = false
	r.finished = true
	r.mu.Unlock()
	r.notify()
	r.logf("Stopped the pod")
}

func (r *podRun) deleting() bool { return r.ctx.Err() != nil }

// runContainer runs container i until it is done for good: it exited and the
// restart policy says no more, or the pod is being deleted. It reports whether
// the container succeeded (for init containers: whether to go on).
func (r *podRun) runContainer(init bool, i int) bool {
	spec := &r.pod.Spec
	c := &spec.Containers
	if init {
		c = &spec.InitContainers
	}
	ctr := &(*c)[i]
	policy := spec.RestartPolicy
	if init && policy == corev1.RestartPolicyAlways {
		policy = corev1.RestartPolicyOnFailure
	}
	var restarts int32
	for !r.deleting() {
		proc, err := r.p.process(r, ctr)
		var cfgErr *podspec.ConfigError
		var imgErr *podspec.ImageError
		switch {
		case errors.As(err, &imgErr):
			r.logf("Failed the pod: unsupported image", "container", ctr.Name, "image", ctr.Image)
			r.mu.Lock()
			r.failReason, r.failMessage = "UnsupportedImage", imgErr.Msg
			r.markAllTerminated("UnsupportedImage", imgErr.Msg)
			r.mu.Unlock()
			r.notify()
			r.cancel()
			return false
		case errors.As(err, &cfgErr):
			r.setStatus(init, i, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: cfgErr.Msg}}
			})
			if !r.sleep(5 * time.Second) {
				return false
			}
			continue
		case err != nil:
			r.setStatus(init, i, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: err.Error()}}
			})
			if !r.sleep(5 * time.Second) {
				return false
			}
			continue
		}
		exit, started, finished, err := r.startAndWait(init, i, ctr, proc, restarts)
		if err != nil {
			r.setStatus(init, i, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "RunContainerError", Message: err.Error()}}
			})
			if !r.sleep(5 * time.Second) {
				return false
			}
			continue
		}
		term := &corev1.ContainerStateTerminated{
			ExitCode: exit, Reason: podspec.TerminatedReason(exit, false),
			StartedAt: started, FinishedAt: finished, ContainerID: containerID(r, ctr.Name, restarts),
		}
		r.logf("Container exited", "container", ctr.Name, "exitCode", exit, "restarts", restarts)
		if r.deleting() || !podspec.ShouldRestart(policy, exit) {
			r.setStatus(init, i, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Terminated: term}
				s.Ready, s.Started = false, new(false)
			})
			return exit == 0
		}
		// A container that ran for 10 minutes starts over with the shortest back-off.
		if finished.Sub(started.Time) > 10*time.Minute {
			restarts = 0
		}
		backoff := podspec.Backoff(restarts)
		restarts++
		r.setStatus(init, i, func(s *corev1.ContainerStatus) {
			s.LastTerminationState = corev1.ContainerState{Terminated: term}
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason:  "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", backoff, ctr.Name, r.pod.Name)}}
			s.Ready, s.Started = false, new(false)
			s.RestartCount++
		})
		if !r.sleep(backoff) {
			r.setStatus(init, i, func(s *corev1.ContainerStatus) {
				s.State = s.LastTerminationState
			})
			return false
		}
	}
	// Deleted before it (re)started.
	r.setStatus(init, i, func(s *corev1.ContainerStatus) {
		if s.State.Terminated == nil {
			now := metav1.Now()
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now,
			}}
		}
		s.Ready = false
	})
	return false
}

func containerID(r *podRun, name string, restarts int32) string {
	return fmt.Sprintf("localcluster://%s-%s-%d", r.id, name, restarts)
}

// sleep waits d unless the pod is deleted first; it reports whether it waited.
func (r *podRun) sleep(d time.Duration) bool {
	select {
	case <-r.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// startAndWait starts the container's process, runs its probes, and returns
// its exit code once it exits.
func (r *podRun) startAndWait(
	init bool, i int, ctr *corev1.Container, proc podspec.Process, restarts int32,
) (int32, metav1.Time, metav1.Time, error) {
	logPath := r.logPath(ctr.Name, restarts)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, metav1.Time{}, metav1.Time{}, err
	}
	defer func() { _ = logFile.Close() }() // the child keeps its own descriptor
	cmd := r.p.wrap(context.Background(), r, proc)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, metav1.Time{}, metav1.Time{}, fmt.Errorf("starting %s: %w", proc.Path, err)
	}
	started := metav1.Now()
	pidFile := filepath.Join(r.dir, ctr.Name+".pid")
	_ = supervise.WritePidFile(pidFile, cmd.Process.Pid, proc.Path)
	r.mu.Lock()
	r.procs[ctr.Name] = cmd.Process
	r.mu.Unlock()
	r.logf("Started container", "container", ctr.Name, "pid", cmd.Process.Pid, "binary", proc.Path, "restarts", restarts)
	hasReadiness := ctr.ReadinessProbe != nil && !init
	r.setStatus(init, i, func(s *corev1.ContainerStatus) {
		s.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
		s.ContainerID = containerID(r, ctr.Name, restarts)
		s.Started = new(ctr.StartupProbe == nil)
		s.Ready = !hasReadiness && !init
	})
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	probeCtx, stopProbes := context.WithCancel(r.ctx)
	if !init {
		go r.probe(probeCtx, i, ctr, cmd.Process)
	}
	select {
	case <-exited:
	case <-r.ctx.Done():
		r.stopProcess(cmd.Process, exited)
	}
	stopProbes()
	finished := metav1.Now()
	r.mu.Lock()
	delete(r.procs, ctr.Name)
	r.mu.Unlock()
	_ = os.Remove(pidFile)
	return exitCode(cmd.ProcessState, waitErr), started, finished, nil
}

// stopProcess sends SIGTERM, then SIGKILL to the process group after the
// grace period.
func (r *podRun) stopProcess(p *os.Process, exited <-chan struct{}) {
	r.mu.Lock()
	grace := r.grace
	r.mu.Unlock()
	_ = syscall.Kill(p.Pid, syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(grace):
	}
	r.logf("Killed a container that outlived its grace period", "pid", p.Pid, "grace", grace)
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	<-exited
}

func exitCode(ps *os.ProcessState, err error) int32 {
	if ps == nil {
		if err != nil {
			return 128
		}
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

func (r *podRun) logPath(container string, restarts int32) string {
	return filepath.Join(r.dir, fmt.Sprintf("%s.%d.log", container, restarts))
}

// probeMode says what a probe's verdict does.
type probeMode int

const (
	probeStartup   probeMode = iota // returns once it succeeded; kills on failure
	probeLiveness                   // kills the container on failure
	probeReadiness                  // reports the verdict
)

// probe runs the startup, liveness and readiness probes of a running
// container. A failed liveness (or startup) probe kills the container.
func (r *podRun) probe(ctx context.Context, i int, ctr *corev1.Container, proc *os.Process) {
	r.mu.Lock()
	ip := r.ip
	r.mu.Unlock()
	target := func(p *corev1.Probe) *podspec.ProbeTarget {
		if p == nil {
			return nil
		}
		t, err := podspec.Probe(p, ctr, ip)
		if err != nil {
			r.logf("Ignored an invalid probe", "container", ctr.Name, "err", err)
			return nil
		}
		return &t
	}
	startup, liveness, readiness := target(ctr.StartupProbe), target(ctr.LivenessProbe), target(ctr.ReadinessProbe)
	if startup != nil {
		if !r.runProbe(ctx, ctr, *startup, probeStartup, proc, nil) {
			return
		}
		r.setStatus(false, i, func(s *corev1.ContainerStatus) { s.Started = new(true) })
	}
	if liveness != nil {
		go r.runProbe(ctx, ctr, *liveness, probeLiveness, proc, nil)
	}
	if readiness != nil {
		r.runProbe(ctx, ctr, *readiness, probeReadiness, proc, func(ready bool) {
			r.setStatus(false, i, func(s *corev1.ContainerStatus) { s.Ready = ready })
		})
	}
}

// runProbe probes every period until ctx ends. Readiness reports verdict
// changes to onChange; liveness and startup kill proc when failures reach the
// threshold; startup returns true at its first success.
func (r *podRun) runProbe(
	ctx context.Context, ctr *corev1.Container, t podspec.ProbeTarget, mode probeMode, proc *os.Process, onChange func(bool),
) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(t.InitialDelay):
	}
	var res podspec.ProbeResult
	res.OK = mode == probeLiveness // a live container is alive until proven otherwise
	for {
		ok := r.check(ctx, t)
		if ctx.Err() != nil {
			return false
		}
		changed := res.Observe(t, ok)
		switch mode {
		case probeReadiness:
			if changed {
				onChange(res.OK)
			}
		case probeStartup:
			if res.OK {
				return true
			}
			fallthrough
		case probeLiveness:
			if res.Failed(t) {
				r.logf("Probe failed, killing the container", "container", ctr.Name, "kind", t.Kind, "failures", t.FailureThreshold)
				_ = syscall.Kill(proc.Pid, syscall.SIGTERM)
				return false
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(t.Period):
		}
	}
}

// check runs one probe: HTTP and TCP to the pod's address on the bridge,
// exec through the pod's namespaces.
func (r *podRun) check(ctx context.Context, t podspec.ProbeTarget) bool {
	ctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	switch t.Kind {
	case "http":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
		if err != nil {
			return false
		}
		req.Header.Set("User-Agent", "kube-probe/1.37")
		for k, v := range t.Headers {
			req.Header.Set(k, v)
		}
		resp, err := r.p.probeClient.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case "tcp", "grpc":
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", t.Addr)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	case "exec":
		if len(t.Command) == 0 {
			return false
		}
		proc := podspec.Process{Path: t.Command[0], Args: t.Command[1:]}
		probe := &corev1.Container{Name: "probe", Image: r.pod.Spec.Containers[0].Image, Command: t.Command}
		if mapped, args, err := podspec.Command(probe, r.p.images, r.p.binDir, nil); err == nil {
			proc.Path, proc.Args = mapped, args
		} else if path, err := exec.LookPath(t.Command[0]); err == nil {
			proc.Path = path
		}
		cmd := r.p.wrap(ctx, r, proc)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		return cmd.Run() == nil
	}
	return false
}

// readLog returns the path of the current (or previous) log of a container.
func (r *podRun) readLog(container string, previous bool) (string, error) {
	r.mu.Lock()
	var restarts int32 = -1
	for _, s := range append(cloneStatuses(r.initStatuses), r.statuses...) {
		if s.Name == container {
			restarts = s.RestartCount
		}
	}
	r.mu.Unlock()
	if restarts < 0 {
		return "", fmt.Errorf("pod %s has no container %q", r.key, container)
	}
	if previous {
		if restarts == 0 {
			return "", fmt.Errorf("previous terminated container %q in pod %s not found", container, r.key)
		}
		restarts--
	}
	// Waiting to restart: the current log is the last run's, as in the kubelet.
	for restarts > 0 {
		if _, err := os.Stat(r.logPath(container, restarts)); err == nil {
			break
		}
		restarts--
	}
	return r.logPath(container, restarts), nil
}

func idOf(uid string) string {
	return strings.ReplaceAll(uid, "-", "")[:8]
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
