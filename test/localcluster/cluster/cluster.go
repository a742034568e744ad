// Package cluster brings the local cluster up and down as a whole: the state
// dir and its cluster.json, the programs built from this repo, the control
// plane (package controlplane) and the node (package kubelet: a kubelet on
// containerd and runc, kube-proxy and CoreDNS).
//
// Everything the cluster runs is recorded by pid under <state>/pids and
// stopped by pid in Down; Down then removes the pod sandboxes, iptables rules,
// cgroups, mounts, interfaces and files the cluster created.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/controlplane"
	"github.com/outbox-dev/outbox-operator/test/localcluster/kubelet"
	"github.com/outbox-dev/outbox-operator/test/localcluster/supervise"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Environment variables read by this package.
const (
	// EnvStateDir overrides DefaultStateDir.
	EnvStateDir = "LOCAL_CLUSTER_DIR"
	// EnvAssets names the dir of the control plane's and the node's
	// binaries (default: the output of hack/setup-envtest.sh --with-node).
	EnvAssets = "LOCAL_CLUSTER_ASSETS"
)

// DefaultStateDir holds the running cluster. It is outside /tmp, as it lives
// as long as the cluster.
const DefaultStateDir = "/var/lib/outbox-local-cluster"

// NodeKubelet is State.Node of every cluster this package makes: a real
// kubelet on containerd and runc, running the images built from the
// Dockerfile (package kubelet). An older checkout's clusters ran pods as host
// processes instead (State.Node "process" or empty); Up refuses such a state
// dir and Down still removes it.
const NodeKubelet = "kubelet"

// ProjectImage and SampleImage are the image repositories of this repo's
// images (make image-offline): the operator's and the sample application's
// (the Dockerfile's default target and its target sample).
const (
	ProjectImage = "ghcr.io/outbox-dev/outbox-operator"
	SampleImage  = "ghcr.io/outbox-dev/outbox-operator-sample"
)

// State is the cluster's shape, chosen once by Up and kept in
// <state>/cluster.json so that every later command, and the node process,
// agrees with it.
type State struct {
	controlplane.Config
	// Gateway is the host's address on the pod bridge (first of PodCIDR):
	// the node's address, where the API server and the kubelet listen.
	Gateway string
	// Bridge is the host's bridge of the pod network. NetnsPrefix named the
	// network namespaces of an older checkout's process node (Down removes
	// any left).
	Bridge      string
	NetnsPrefix string `json:",omitempty"`
	KubeletPort int
	// Node is NodeKubelet; "process" or empty in a state dir of an older
	// checkout.
	Node string `json:",omitempty"`
	// KubeletHealthzPort is the kubelet's /healthz on 127.0.0.1;
	// ProxyHealthzPort and ProxyMetricsPort are kube-proxy's.
	KubeletHealthzPort int `json:",omitempty"`
	ProxyHealthzPort   int `json:",omitempty"`
	ProxyMetricsPort   int `json:",omitempty"`
	// BinDir holds the programs built at up: localcluster (the demo's
	// servers) and pause (the node's pause image).
	BinDir string
	// RepoDir is the checkout the binaries were built from.
	RepoDir string
}

// Options of Up.
type Options struct {
	StateDir  string
	RepoDir   string
	AssetsDir string
	// PodCIDR, ServiceCIDR and Bridge default to 10.244.0.0/16, 10.96.0.0/16, obx0.
	PodCIDR, ServiceCIDR, Bridge string
	NodeName                     string
	// Images are OCI archives (make image-offline) that the node imports
	// into containerd.
	Images []string
	// SkipBuild reuses the programs in <state>/bin.
	SkipBuild bool
	Out       io.Writer
}

// StateDirFromEnv is $LOCAL_CLUSTER_DIR or DefaultStateDir.
func StateDirFromEnv() string {
	if d := os.Getenv(EnvStateDir); d != "" {
		return d
	}
	return DefaultStateDir
}

// Load reads <dir>/cluster.json.
func Load(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing %s/cluster.json: %w", dir, err)
	}
	return &s, nil
}

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.StateDir, "cluster.json"), b, 0o644)
}

// legacyPodsDir held the pods of an older checkout's process node.
func (s *State) legacyPodsDir() string { return filepath.Join(s.StateDir, "pods") }

// bridge describes the pod bridge for package kubelet.
func (s *State) bridge() kubelet.Bridge {
	return kubelet.Bridge{Name: s.Bridge, CIDR: s.PodCIDR, Gateway: s.Gateway, LegacyPrefix: s.NetnsPrefix}
}

func newState(o Options) (*State, error) {
	s := &State{}
	s.StateDir = o.StateDir
	s.NodeName = cmpOr(o.NodeName, "local-node")
	s.PodCIDR = cmpOr(o.PodCIDR, "10.244.0.0/16")
	s.ServiceCIDR = cmpOr(o.ServiceCIDR, "10.96.0.0/16")
	s.Bridge = cmpOr(o.Bridge, "obx0")
	s.RepoDir = o.RepoDir
	s.BinDir = filepath.Join(o.StateDir, "bin")
	s.Node = NodeKubelet
	svcIP, err := nthIP(s.ServiceCIDR, 1)
	if err != nil {
		return nil, err
	}
	s.ServiceIP = svcIP
	if s.Gateway, err = nthIP(s.PodCIDR, 1); err != nil {
		return nil, err
	}
	// Pods reach the API server where the kubernetes Service's endpoint is:
	// the host's address on the bridge.
	s.AdvertiseAddress, s.BindAddress = s.Gateway, s.Gateway
	for _, p := range []*int{
		&s.EtcdPort, &s.EtcdPeerPort, &s.APIServerPort, &s.ControllerManagerPort, &s.SchedulerPort,
		&s.KubeletPort, &s.KubeletHealthzPort, &s.ProxyHealthzPort, &s.ProxyMetricsPort,
	} {
		if *p, err = controlplane.FreePort(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func nthIP(cidr string, n byte) (string, error) {
	_, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return "", fmt.Errorf("parsing %q: %w", cidr, err)
	}
	ip := ipnet.IP.To4()
	if ip == nil {
		return "", fmt.Errorf("%s: only IPv4 ranges are supported", cidr)
	}
	out := make(net.IP, 4)
	copy(out, ip)
	out[3] += n
	return out.String(), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Up starts what is not running yet and waits until the node is Ready and
// the cluster DNS runs. A cluster that runs already is reused as it is.
func Up(ctx context.Context, o Options) (*State, error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root: it runs containerd and the kubelet, and makes a bridge, iptables rules and cgroups")
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return nil, err
	}
	s, err := Load(o.StateDir)
	fresh := errors.Is(err, os.ErrNotExist)
	if fresh {
		if s, err = newState(o); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if s.Node != NodeKubelet {
		return nil, fmt.Errorf("%s holds a cluster of an older checkout, whose node ran pods as host processes; "+
			"remove it first: go run ./hack/localcluster down --state-dir %s (make demo-down)", s.StateDir, s.StateDir)
	}
	if o.RepoDir != "" {
		s.RepoDir = o.RepoDir
	}
	if s.AssetsDir, err = assets(ctx, o, s.RepoDir); err != nil {
		return nil, err
	}
	// Missing packages, binaries or cgroup controllers, another cluster and
	// a port taken by another program are named before anything starts.
	if err := kubelet.Preflight(s.KubeletConfig()); err != nil {
		if fresh {
			_ = os.Remove(o.StateDir) // only if still empty
		}
		return nil, err
	}
	if err := portsFree(s); err != nil {
		return nil, err
	}
	if err := s.save(); err != nil {
		return nil, err
	}
	if !o.SkipBuild {
		start := time.Now()
		_, _ = fmt.Fprintf(out, "Building localcluster and pause into %s ...\n", s.BinDir)
		if err := build(ctx, s.RepoDir, s.BinDir); err != nil {
			return nil, err
		}
		_, _ = fmt.Fprintf(out, "Built in %s.\n", time.Since(start).Round(100*time.Millisecond))
	}
	// The API server listens on the bridge's address.
	if err := kubelet.EnsureBridge(s.bridge()); err != nil {
		return s, err
	}
	started, err := controlplane.Start(ctx, s.Config)
	for _, name := range started {
		_, _ = fmt.Fprintf(out, "Started %s (log: %s).\n", name, filepath.Join(s.LogDir(), name+".log"))
	}
	if err != nil {
		return s, err
	}
	return s, upKubelet(ctx, s, o.Images, out)
}

// portsFree checks that the ports of each process of the cluster that is not
// running are free: they were chosen free at the first up, and another
// program may have taken one since (after a reboot, say).
func portsFree(s *State) error {
	running := Status(s)
	ports := []struct {
		name string
		port int
	}{
		{controlplane.Etcd, s.EtcdPort}, {controlplane.Etcd, s.EtcdPeerPort},
		{controlplane.APIServer, s.APIServerPort}, {controlplane.ControllerManager, s.ControllerManagerPort},
		{controlplane.Scheduler, s.SchedulerPort}, {kubelet.Kubelet, s.KubeletPort},
		{kubelet.Kubelet, s.KubeletHealthzPort}, {kubelet.KubeProxy, s.ProxyHealthzPort},
		{kubelet.KubeProxy, s.ProxyMetricsPort},
	}
	var errs []error
	for _, p := range ports {
		if running[p.name] || p.port == 0 {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p.port))
		if err != nil {
			errs = append(errs, fmt.Errorf("port %d of %s is taken by another program (%w): stop that program, "+
				"or remove this cluster (go run ./hack/localcluster down --state-dir %s) so that the next up picks free ports",
				p.port, p.name, err, s.StateDir))
			continue
		}
		_ = l.Close()
	}
	return errors.Join(errs...)
}

// upKubelet starts the real node (containerd, the kubelet, kube-proxy) on
// the pod bridge, imports the images, waits for the Node to be Ready, then
// installs the cluster DNS add-on (CoreDNS) and waits for it.
func upKubelet(ctx context.Context, s *State, images []string, out io.Writer) error {
	cfg := s.KubeletConfig()
	started, err := kubelet.Start(ctx, cfg, images)
	for _, name := range started {
		_, _ = fmt.Fprintf(out, "Started %s (log: %s).\n", name, filepath.Join(s.LogDir(), name+".log"))
	}
	if err != nil {
		return err
	}
	pid, _ := supervise.AliveFromFile(filepath.Join(s.PidDir(), kubelet.Kubelet+".pid"))
	if err := waitNodeReady(ctx, s, pid, kubelet.Kubelet); err != nil {
		return err
	}
	cs, err := s.Client()
	if err != nil {
		return err
	}
	return kubelet.EnsureDNS(ctx, cs, cfg)
}

// KubeletConfig is the shape of the real node (Node == NodeKubelet).
func (s *State) KubeletConfig() kubelet.Config {
	return kubelet.Config{
		StateDir: s.StateDir, AssetsDir: s.AssetsDir, NodeName: s.NodeName, NodeIP: s.Gateway,
		Bridge: s.Bridge, PodCIDR: s.PodCIDR, ClusterDNS: s.ClusterDNS(),
		KubeletPort: s.KubeletPort, HealthzPort: s.KubeletHealthzPort,
		ProxyHealthzPort: s.ProxyHealthzPort, ProxyMetricsPort: s.ProxyMetricsPort, ServiceCIDR: s.ServiceCIDR,
		PKIDir: s.PKIDir(), Kubeconfig: s.ComponentKubeconfig(controlplane.KubeconfigKubelet),
		ProxyKubeconfig: s.ComponentKubeconfig(controlplane.KubeconfigProxy),
		PidDir:          s.PidDir(), LogDir: s.LogDir(), PauseBinary: filepath.Join(s.BinDir, "pause"),
		CgroupRoot: "/outbox-local-cluster-" + s.Bridge,
	}
}

// ClusterDNS is the cluster DNS Service's address: the tenth of the service range.
func (s *State) ClusterDNS() string {
	ip, err := nthIP(s.ServiceCIDR, 10)
	if err != nil {
		return ""
	}
	return ip
}

// assets finds the binaries of the control plane and the node.
func assets(ctx context.Context, o Options, repo string) (string, error) {
	if o.AssetsDir != "" {
		return o.AssetsDir, nil
	}
	if d := os.Getenv(EnvAssets); d != "" {
		return d, nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack/setup-envtest.sh"), "--with-node")
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-envtest.sh --with-node: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// build compiles the localcluster command (which starts the demo's servers)
// and the pause program into dir, without cgo: pause goes into an image with
// nothing else in it.
func build(ctx context.Context, repo, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./hack/localcluster", "./test/localcluster/pause")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, stderr.String())
	}
	return nil
}

// Client returns a clientset for the admin kubeconfig.
func (s *State) Client() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func waitNodeReady(ctx context.Context, s *State, pid int, process string) error {
	cs, err := s.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		if !supervise.Alive(pid, "") {
			return fmt.Errorf("the node's %s exited; see %s", process, filepath.Join(s.LogDir(), process+".log"))
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, s.NodeName, metav1.GetOptions{})
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the node %s did not become Ready: %w", s.NodeName, ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// Status lists each process of the cluster and whether it runs.
func Status(s *State) map[string]bool {
	m := controlplane.Running(s.Config)
	maps.Copy(m, kubelet.Running(s.KubeletConfig()))
	return m
}

// Down stops the node (kubelet.Stop: the kubelet, then every pod sandbox
// through the CRI, then containerd and kube-proxy, and what they made:
// iptables rules, cgroups, mounts) and the control plane by pid, removes the
// pod bridge and, unless keepState, the state dir.
func Down(s *State, keepState bool) error {
	var errs []error
	if s.Node == NodeKubelet {
		// The kubelet and containerd first: the CNI plugins release the pods'
		// addresses while the bridge is still there.
		errs = append(errs, kubelet.Stop(s.KubeletConfig()))
	} else {
		// An older checkout's process node: its pid file is among those
		// below, its pods' processes have pid files of their own.
		errs = append(errs, stopAll(filepath.Join(s.PidDir(), "node.pid")), stopAll(filepath.Join(s.legacyPodsDir(), "*", "*.pid")))
	}
	errs = append(errs, controlplane.Stop(s.Config), kubelet.RemoveBridge(s.bridge()))
	// Extra processes the demo recorded (its PostgreSQL and Redis), listed after
	// the stops above, which remove the pid files of what they stopped.
	errs = append(errs, stopAll(filepath.Join(s.PidDir(), "*.pid")))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if keepState {
		return nil
	}
	return os.RemoveAll(s.StateDir)
}

// stopAll stops the process of every pid file that matches pattern.
func stopAll(pattern string) error {
	files, _ := filepath.Glob(pattern)
	errs := make([]error, 0, len(files))
	for _, f := range files {
		errs = append(errs, supervise.Stop(f, 30*time.Second))
	}
	return errors.Join(errs...)
}
