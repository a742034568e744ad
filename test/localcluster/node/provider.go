package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/netns"
	"github.com/outbox-dev/outbox-operator/test/localcluster/podspec"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Provider is the virtual-kubelet provider of the local cluster: it runs each
// pod as host processes in a network namespace of its own.
type Provider struct {
	log         *slog.Logger
	client      kubernetes.Interface
	secrets     corev1listers.SecretLister
	configMaps  corev1listers.ConfigMapLister
	services    corev1listers.ServiceLister
	network     netns.Network
	images      []podspec.Image
	binDir      string
	self        string // the localcluster binary: `self podexec` wraps every process
	podsDir     string
	hostIP      string
	proxy       *serviceProxy
	ipam        *ipam
	probeClient *http.Client

	mu     sync.Mutex
	pods   map[string]*podRun
	notify func(*corev1.Pod)
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// CreatePod starts the pod's sandbox and containers in the background.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	if old, ok := p.pods[key]; ok {
		if old.pod.UID == pod.UID {
			p.mu.Unlock()
			return nil
		}
		p.mu.Unlock()
		return fmt.Errorf("pod %s: a previous pod of that name is still stopping", key)
	}
	id := idOf(string(pod.UID))
	dir := filepath.Join(p.podsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.mu.Unlock()
		return err
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &podRun{
		p: p, key: key, id: id, dir: dir, ctx: rctx, cancel: cancel, done: make(chan struct{}),
		pod: pod.DeepCopy(), procs: map[string]*os.Process{}, grace: gracePeriod(pod),
	}
	imageID := func(img string) string { return "localcluster://" + podspec.Repository(img) }
	r.initStatuses = initialStatuses(pod.Spec.InitContainers, imageID)
	r.statuses = initialStatuses(pod.Spec.Containers, imageID)
	r.pod.Status = corev1.PodStatus{Phase: corev1.PodPending}
	p.pods[key] = r
	p.mu.Unlock()
	p.log.Info("Accepted pod", "pod", key, "uid", pod.UID)
	go r.run()
	return nil
}

func gracePeriod(pod *corev1.Pod) time.Duration {
	if pod.DeletionGracePeriodSeconds != nil {
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// UpdatePod takes the new spec; running processes are not changed (the
// fields a pod may change in place do not concern them).
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	r, ok := p.pods[podKey(pod.Namespace, pod.Name)]
	p.mu.Unlock()
	if !ok {
		return p.CreatePod(ctx, pod)
	}
	r.mu.Lock()
	r.pod.Labels, r.pod.Annotations = pod.Labels, pod.Annotations
	r.mu.Unlock()
	return nil
}

// DeletePod stops the pod's containers (SIGTERM, then SIGKILL after the grace
// period) and removes its sandbox, in the background; the pod's final status
// is notified when done.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	r, ok := p.pods[key]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s is not on this node", key)
	}
	r.mu.Lock()
	if pod.DeletionGracePeriodSeconds != nil {
		r.grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	r.mu.Unlock()
	p.log.Info("Stopping pod", "pod", key, "grace", r.grace)
	r.cancel()
	go func() {
		<-r.done
		p.mu.Lock()
		if p.pods[key] == r {
			delete(p.pods, key)
		}
		p.mu.Unlock()
		_ = os.RemoveAll(r.dir)
	}()
	return nil
}

// GetPod returns the pod with its current status.
func (p *Provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, name)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return r.snapshot(), nil
}

// GetPodStatus returns the pod's current status.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod on this node.
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	out := make([]*corev1.Pod, len(runs))
	for i, r := range runs {
		out[i] = r.snapshot()
	}
	return out, nil
}

// NotifyPods registers the pod controller's status callback.
func (p *Provider) NotifyPods(ctx context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

func (p *Provider) notifyPod(pod *corev1.Pod) {
	p.mu.Lock()
	f := p.notify
	p.mu.Unlock()
	if f != nil {
		f(pod)
	}
}

// stopAll stops every pod, for the node's shutdown.
func (p *Provider) stopAll() {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	for _, r := range runs {
		r.cancel()
	}
	for _, r := range runs {
		<-r.done
		_ = os.RemoveAll(r.dir)
	}
}

// gc forgets pods that ended and are gone from the API server (the pod
// controller deletes finished pods without calling DeletePod).
func (p *Provider) gc(pods corev1listers.PodLister) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, r := range p.pods {
		ns, name, _ := strings.Cut(key, "/")
		live, err := pods.Pods(ns).Get(name)
		if err == nil && live.UID == r.pod.UID {
			continue
		}
		r.cancel()
		select {
		case <-r.done:
			delete(p.pods, key)
			_ = os.RemoveAll(r.dir)
		default:
		}
	}
}

// sources resolves env references through the informers' caches, falling
// back to the API server for objects the cache does not hold yet.
type sources struct{ p *Provider }

func (s sources) Secret(ns, name string) (*corev1.Secret, error) {
	if sec, err := s.p.secrets.Secrets(ns).Get(name); err == nil {
		return sec, nil
	}
	return s.p.client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
}

func (s sources) ConfigMap(ns, name string) (*corev1.ConfigMap, error) {
	if cm, err := s.p.configMaps.ConfigMaps(ns).Get(name); err == nil {
		return cm, nil
	}
	return s.p.client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
}

func (s sources) Services(ns string) ([]*corev1.Service, error) {
	svcs, err := s.p.services.Services(ns).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	if k, err := s.p.services.Services("default").Get("kubernetes"); err == nil && ns != "default" {
		svcs = append(svcs, k)
	}
	return svcs, nil
}

// process translates a container of r into the process to run.
func (p *Provider) process(r *podRun, c *corev1.Container) (podspec.Process, error) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	ip := r.ip
	r.mu.Unlock()
	env, err := podspec.Env(pod, c, sources{p}, podspec.Runtime{PodIP: ip, HostIP: p.hostIP})
	if err != nil {
		return podspec.Process{}, err
	}
	path, args, err := podspec.Command(c, p.images, p.binDir, env)
	if err != nil {
		return podspec.Process{}, err
	}
	uid, gid, err := podspec.RunAs(pod, c, p.images)
	if err != nil {
		return podspec.Process{}, err
	}
	base := make([]podspec.EnvVar, 0, 3+len(env))
	base = append(base,
		podspec.EnvVar{Name: "PATH", Value: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		podspec.EnvVar{Name: "HOSTNAME", Value: pod.Name},
		podspec.EnvVar{Name: "HOME", Value: "/"},
	)
	return podspec.Process{Path: path, Args: args, Env: append(base, env...), UID: uid, GID: gid}, nil
}

// wrap builds the command that runs proc inside r's namespaces.
func (p *Provider) wrap(ctx context.Context, r *podRun, proc podspec.Process) *exec.Cmd {
	workdir := "/"
	args := make([]string, 0, 17+len(proc.Args))
	args = append(args, "podexec",
		"--netns", netns.NamespacePath(p.network.Name(r.id)),
		"--hosts", filepath.Join(r.dir, "hosts"),
		"--run", filepath.Join(r.dir, "run"),
		"--hostname", r.pod.Name,
		"--uid", itoa(proc.UID), "--gid", itoa(proc.GID),
		"--dir", workdir,
		"--", proc.Path)
	args = append(args, proc.Args...)
	cmd := exec.CommandContext(ctx, p.self, args...)
	cmd.Env = podspec.Environ(proc.Env)
	return cmd
}

// writeVolumes materialises the pod's volumes that are mounted under /run or
// /var/run (the service-account token among them) into runDir, which is the
// pod's /run. Volumes mounted elsewhere are not supported and ignored.
func (p *Provider) writeVolumes(ctx context.Context, pod *corev1.Pod, runDir string) error {
	mounts := map[string]string{} // volume name -> path under runDir
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, m := range c.VolumeMounts {
			rel, ok := strings.CutPrefix(filepath.Clean(m.MountPath), "/var/run/")
			if !ok {
				rel, ok = strings.CutPrefix(filepath.Clean(m.MountPath), "/run/")
			}
			if ok {
				mounts[m.Name] = filepath.Join(runDir, rel)
			}
		}
	}
	for _, v := range pod.Spec.Volumes {
		dir, ok := mounts[v.Name]
		if !ok {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		files, refresh, err := p.volumeFiles(ctx, pod, v)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if err := writeFiles(dir, files); err != nil {
			return err
		}
		if refresh > 0 {
			go p.refreshVolume(pod, v, dir, refresh)
		}
	}
	return nil
}

func writeFiles(dir string, files map[string][]byte) error {
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, content, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

// refreshVolume renews a projected token before it expires, while the pod runs.
func (p *Provider) refreshVolume(pod *corev1.Pod, v corev1.Volume, dir string, every time.Duration) {
	key := podKey(pod.Namespace, pod.Name)
	for {
		time.Sleep(every)
		p.mu.Lock()
		r, ok := p.pods[key]
		p.mu.Unlock()
		if !ok || r.pod.UID != pod.UID || r.deleting() {
			return
		}
		files, _, err := p.volumeFiles(context.Background(), pod, v)
		if err == nil {
			err = writeFiles(dir, files)
		}
		if err != nil {
			p.log.Error("Refreshing a volume failed", "pod", key, "volume", v.Name, "err", err)
		}
	}
}

// volumeFiles returns the files of a projected, secret, configMap, downwardAPI
// or emptyDir volume, and how often they need refreshing (tokens).
func (p *Provider) volumeFiles(ctx context.Context, pod *corev1.Pod, v corev1.Volume) (map[string][]byte, time.Duration, error) {
	files := map[string][]byte{}
	var refresh time.Duration
	src := sources{p}
	addKeys := func(data map[string][]byte, items []corev1.KeyToPath) {
		if len(items) == 0 {
			for k, val := range data {
				files[k] = val
			}
			return
		}
		for _, it := range items {
			if val, ok := data[it.Key]; ok {
				files[it.Path] = val
			}
		}
	}
	secretData := func(name string) (map[string][]byte, error) {
		s, err := src.Secret(pod.Namespace, name)
		if err != nil {
			return nil, err
		}
		return s.Data, nil
	}
	cmData := func(name string) (map[string][]byte, error) {
		cm, err := src.ConfigMap(pod.Namespace, name)
		if err != nil {
			return nil, err
		}
		m := map[string][]byte{}
		for k, val := range cm.Data {
			m[k] = []byte(val)
		}
		return m, nil
	}
	switch {
	case v.EmptyDir != nil:
	case v.Secret != nil:
		d, err := secretData(v.Secret.SecretName)
		if err != nil {
			return nil, 0, err
		}
		addKeys(d, v.Secret.Items)
	case v.ConfigMap != nil:
		d, err := cmData(v.ConfigMap.Name)
		if err != nil {
			return nil, 0, err
		}
		addKeys(d, v.ConfigMap.Items)
	case v.Projected != nil:
		for _, s := range v.Projected.Sources {
			switch {
			case s.ServiceAccountToken != nil:
				exp := int64(3600)
				if s.ServiceAccountToken.ExpirationSeconds != nil {
					exp = *s.ServiceAccountToken.ExpirationSeconds
				}
				tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
					ExpirationSeconds: &exp,
					BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				}}
				if s.ServiceAccountToken.Audience != "" {
					tr.Spec.Audiences = []string{s.ServiceAccountToken.Audience}
				}
				sa := pod.Spec.ServiceAccountName
				if sa == "" {
					sa = "default"
				}
				out, err := p.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
				if err != nil {
					return nil, 0, fmt.Errorf("requesting a token for service account %s/%s: %w", pod.Namespace, sa, err)
				}
				files[s.ServiceAccountToken.Path] = []byte(out.Status.Token)
				refresh = time.Duration(exp) * time.Second * 4 / 5
			case s.ConfigMap != nil:
				d, err := cmData(s.ConfigMap.Name)
				if err != nil && !optional(s.ConfigMap.Optional) {
					return nil, 0, err
				}
				addKeys(d, s.ConfigMap.Items)
			case s.Secret != nil:
				d, err := secretData(s.Secret.Name)
				if err != nil && !optional(s.Secret.Optional) {
					return nil, 0, err
				}
				addKeys(d, s.Secret.Items)
			case s.DownwardAPI != nil:
				for _, it := range s.DownwardAPI.Items {
					if it.FieldRef == nil {
						continue
					}
					val, err := podspec.FieldRef(pod, it.FieldRef.FieldPath, podspec.Runtime{HostIP: p.hostIP})
					if err != nil {
						return nil, 0, err
					}
					files[it.Path] = []byte(val)
				}
			}
		}
	}
	return files, refresh, nil
}

func optional(b *bool) bool { return b != nil && *b }

// GetContainerLogs serves `kubectl logs`: the container's output, kept in a
// file per start (-p reads the previous one), with tail, limit and follow.
func (p *Provider) GetContainerLogs(
	ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts,
) (io.ReadCloser, error) {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	path, err := r.readLog(containerName, opts.Previous)
	if err != nil {
		return nil, errdefs.AsNotFound(err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, errdefs.AsNotFound(fmt.Errorf("no log yet for container %s: %w", containerName, err))
	}
	if opts.Tail > 0 {
		if err := seekTail(f, opts.Tail); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	var rc io.ReadCloser = f
	if opts.Follow {
		rc = &follower{f: f, ctx: ctx, done: func() bool {
			cur, err := r.readLog(containerName, false)
			return err != nil || cur != path || r.deleting()
		}}
	}
	if opts.LimitBytes > 0 {
		rc = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(rc, int64(opts.LimitBytes)), rc}
	}
	return rc, nil
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	lines := 0
	pos := len(b)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' && i != len(b)-1 {
			lines++
			if lines == n {
				pos = i + 1
				break
			}
		}
		if i == 0 {
			pos = 0
		}
	}
	if len(b) == 0 {
		pos = 0
	}
	_, err = f.Seek(int64(pos), io.SeekStart)
	return err
}

// follower reads a growing log until the container's process is replaced or
// the request ends.
type follower struct {
	f    *os.File
	ctx  context.Context
	done func() bool
}

func (fl *follower) Read(b []byte) (int, error) {
	for {
		n, err := fl.f.Read(b)
		if n > 0 || (err != nil && !errors.Is(err, io.EOF)) {
			return n, err
		}
		if fl.done() {
			return 0, io.EOF
		}
		select {
		case <-fl.ctx.Done():
			return 0, io.EOF
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (fl *follower) Close() error { return fl.f.Close() }

// RunInContainer is not supported: containers are processes without an image
// filesystem to run another command in.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	return errdefs.InvalidInput("kubectl exec is not supported by the local cluster's node")
}

// AttachToContainer is not supported.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return errdefs.InvalidInput("kubectl attach is not supported by the local cluster's node")
}

// GetStatsSummary reports no stats.
func (p *Provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return &statsv1alpha1.Summary{}, nil
}

// GetMetricsResource reports no metrics.
func (p *Provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

// PortForward relays a `kubectl port-forward` stream to the pod's address.
func (p *Provider) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	r.mu.Lock()
	ip := r.ip
	r.mu.Unlock()
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))), 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	defer func() { _ = stream.Close() }()
	errc := make(chan error, 2)
	go func() { _, err := io.Copy(conn, stream); errc <- err }()
	go func() { _, err := io.Copy(stream, conn); errc <- err }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}
