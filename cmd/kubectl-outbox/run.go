package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// runOptions are the flags of every command that runs the relay in a pod.
type runOptions struct {
	image   string
	timeout time.Duration
}

// relayRun is one run of the relay binary in the cluster.
type relayRun struct {
	relay     *v1alpha1.OutboxRelay
	command   []string // the relay subcommand: ["dead-letters", "list"]
	flags     []string // its flags, after the layout flags
	withRedis bool     // REDIS_URL (and the Redis CA) in the pod
	stdout    io.Writer
	stderr    io.Writer
}

// notStarting are the waiting reasons of a container that will not start
// without a person fixing something (a missing Secret, an image that cannot
// be pulled).
var notStarting = map[string]bool{
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"InvalidImageName":           true,
	"ErrImageNeverPull":          true,
}

// image is the image the operator runs for the relay: the container of its
// Deployment, else spec.relay.image, else --image.
func (p *plugin) image(ctx context.Context, relay *v1alpha1.OutboxRelay, o *runOptions) (string, corev1.PullPolicy, error) {
	if o.image != "" {
		return o.image, relay.Spec.Relay.ImagePullPolicy, nil
	}
	d := &appsv1.Deployment{}
	if err := p.client.Get(ctx, client.ObjectKey{Namespace: relay.Namespace, Name: controller.DeploymentName(relay)}, d); err == nil {
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "relay" && c.Image != "" {
				return c.Image, c.ImagePullPolicy, nil
			}
		}
	}
	if relay.Spec.Relay.Image != "" {
		return relay.Spec.Relay.Image, relay.Spec.Relay.ImagePullPolicy, nil
	}
	return "", "", fmt.Errorf("cannot tell the relay image of %s/%s: it has no Deployment %s yet and no spec.relay.image; pass --image",
		relay.Namespace, relay.Name, controller.DeploymentName(relay))
}

// run creates the pod, streams its logs, waits for its end and deletes it
// (also when ctx is cancelled: Ctrl-C). A non-zero exit of the relay is an
// *exitError with the same code.
func (p *plugin) run(ctx context.Context, o *runOptions, r relayRun) (err error) {
	image, pullPolicy, err := p.image(ctx, r.relay, o)
	if err != nil {
		return err
	}
	pod := controller.RelayCommandPod(r.relay, image, r.command, r.flags, r.withRedis)
	pod.Spec.Containers[0].ImagePullPolicy = pullPolicy
	if o.timeout > 0 {
		pod.Spec.ActiveDeadlineSeconds = ptr.To(int64(o.timeout.Seconds()))
	}
	created, err := p.pods.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("not allowed to create pods in namespace %q (kubectl outbox runs the relay as a pod there: "+
			"it needs create, get and delete on pods and get on pods/log): %w", pod.Namespace, err)
	}
	if err != nil {
		return fmt.Errorf("creating the relay pod: %w", err)
	}
	name := created.Name
	_, _ = fmt.Fprintf(r.stderr, "Running relay %s in pod %s/%s\n", strings.Join(r.command, " "), created.Namespace, name)
	// running is true while the container may be running: only then does
	// the deletion give it its grace period (SIGTERM, as on Ctrl-C); a pod
	// whose container never started or has ended is deleted at once.
	running := false
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
		defer cancel()
		opts := metav1.DeleteOptions{}
		if !running {
			opts.GracePeriodSeconds = ptr.To[int64](0)
		}
		derr := p.pods.CoreV1().Pods(created.Namespace).Delete(dctx, name, opts)
		if derr != nil && !apierrors.IsNotFound(derr) {
			_, _ = fmt.Fprintf(r.stderr, "Could not delete pod %s/%s: %v (delete it with kubectl delete pod -n %s %s)\n",
				created.Namespace, name, derr, created.Namespace, name)
		} else if ctx.Err() != nil {
			_, _ = fmt.Fprintf(r.stderr, "Interrupted: deleted pod %s/%s\n", created.Namespace, name)
		}
	}()

	if err := p.waitStarted(ctx, created.Namespace, name); err != nil {
		return err
	}
	running = true
	code, err := p.streamUntilExit(ctx, created.Namespace, name, r.stdout, r.stderr)
	if err != nil {
		return err
	}
	running = false
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// waitStarted waits until the container runs or has ended; a container that
// cannot start (a missing Secret or key, an image that cannot be pulled)
// is an error that says why.
func (p *plugin) waitStarted(ctx context.Context, ns, name string) error {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		pod, err := p.pods.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
		}
		if started, err := podStarted(pod); started || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// podStarted tells whether the command's container has started (or ended),
// and why it never will when that is known.
func podStarted(pod *corev1.Pod) (bool, error) {
	if pod.Status.Phase == corev1.PodSucceeded {
		return true, nil
	}
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Running != nil, cs.State.Terminated != nil:
			return true, nil
		case cs.State.Waiting != nil && notStarting[cs.State.Waiting.Reason]:
			return false, fmt.Errorf("the relay pod %s could not start: %s: %s", pod.Name, cs.State.Waiting.Reason,
				cs.State.Waiting.Message)
		}
	}
	if pod.Status.Phase == corev1.PodFailed {
		return false, fmt.Errorf("the relay pod %s failed before its container started: %s: %s", pod.Name,
			pod.Status.Reason, pod.Status.Message)
	}
	return false, nil
}

// streamUntilExit follows the container's log into w until the container
// has ended, and returns its exit code. A follow that does not end with the
// container (some kubelets keep it open) is cut after a short wait; the rest
// of the log is then read without following, skipping what was written.
func (p *plugin) streamUntilExit(ctx context.Context, ns, name string, w, stderr io.Writer) (int, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cw := &countingWriter{w: w}
	followed := make(chan error, 1)
	go func() {
		rc, err := p.pods.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(fctx)
		if err == nil {
			_, err = io.Copy(cw, rc)
			_ = rc.Close()
		}
		followed <- err
	}()
	code, err := p.waitExit(ctx, ns, name)
	if err != nil {
		return 0, err
	}
	var ferr error
	select {
	case ferr = <-followed:
	case <-time.After(2 * time.Second):
		cancel()
		<-followed //nolint:errcheck // the follow's error is then the cancel's; the read below gets the end of the log
	}
	// The end of the log, when the follow missed it (or failed).
	rc, err := p.pods.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		if ferr != nil {
			_, _ = fmt.Fprintf(stderr, "Could not read the logs of pod %s: %v\n", name, err)
		}
		return code, nil
	}
	defer func() { _ = rc.Close() }()
	cw.mu.Lock()
	written := cw.n
	cw.mu.Unlock()
	if _, err := io.CopyN(io.Discard, rc, written); err == nil {
		_, _ = io.Copy(w, rc)
	}
	return code, nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	mu sync.Mutex
	w  io.Writer
	n  int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// waitExit waits for the container's exit code.
func (p *plugin) waitExit(ctx context.Context, ns, name string) (int, error) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		pod, err := p.pods.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil {
				return int(t.ExitCode), nil
			}
		}
		if pod.Status.Phase == corev1.PodFailed {
			return 0, fmt.Errorf("the relay pod %s failed: %s: %s", name, pod.Status.Reason, pod.Status.Message)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}
