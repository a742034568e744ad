// Package cluster brings the local cluster up and down as a whole: the state
// dir and its cluster.json, the binaries built from this repo, the control
// plane (package controlplane) and the node process (package node, run by
// `localcluster node`).
//
// Everything the cluster runs is recorded by pid under <state>/pids and
// stopped by pid in Down; Down then removes the network namespaces, interfaces
// and files the cluster created.
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
	"slices"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/controlplane"
	"github.com/outbox-dev/outbox-operator/test/localcluster/kubelet"
	"github.com/outbox-dev/outbox-operator/test/localcluster/netns"
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
	// EnvAssets names the dir of the control plane binaries (default: the
	// output of hack/setup-envtest.sh --with-control-plane).
	EnvAssets = "LOCAL_CLUSTER_ASSETS"
)

// DefaultStateDir holds the running cluster. It is outside /root and /tmp:
// pods run as their runAsUser (65532 for this project's image) and must be
// able to execute the binaries under it; and it lives as long as the cluster.
const DefaultStateDir = "/var/lib/outbox-local-cluster"

// NodeProcess is the name of the node's pid file and log.
const NodeProcess = "node"

// The kinds of node (Options.Node): the process node runs each pod as host
// processes (package node, a virtual-kubelet); the kubelet node is a real
// kubelet on containerd and runc, running the images built from the
// Dockerfile (package kubelet).
const (
	NodeProcesses = "process"
	NodeKubelet   = "kubelet"
)

// ProjectImage and SampleImage are the image repositories whose containers
// the node runs from the binaries of this repo: the operator's image and the
// sample application's (the Dockerfile's targets operator and sample).
const (
	ProjectImage = "ghcr.io/outbox-dev/outbox-operator"
	SampleImage  = "ghcr.io/outbox-dev/outbox-operator-sample"
)

// State is the cluster's shape, chosen once by Up and kept in
// <state>/cluster.json so that every later command, and the node process,
// agrees with it.
type State struct {
	controlplane.Config
	// Gateway is the host's address on the pod bridge (first of PodCIDR). The
	// service proxy delivers traffic for it to the host's loopback.
	Gateway string
	// ServiceAddress is the address of the services namespace on the bridge
	// (the last usable of PodCIDR), where the service proxy listens.
	ServiceAddress string
	// Bridge is the host's bridge of the pod network; NetnsPrefix starts the
	// name of every pod's network namespace (and the host end of its veth).
	Bridge      string
	NetnsPrefix string
	KubeletPort int
	// Node is the kind of node (NodeProcesses or NodeKubelet; empty is
	// NodeProcesses), chosen at the first up.
	Node string `json:",omitempty"`
	// KubeletHealthzPort is the real kubelet's /healthz on 127.0.0.1;
	// ProxyHealthzPort and ProxyMetricsPort are kube-proxy's.
	KubeletHealthzPort int `json:",omitempty"`
	ProxyHealthzPort   int `json:",omitempty"`
	ProxyMetricsPort   int `json:",omitempty"`
	// BinDir holds manager, relay, orders-api, worker and localcluster, built at up.
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
	// Node is the kind of node of a new cluster: NodeProcesses (the default)
	// or NodeKubelet. A running cluster keeps its kind.
	Node string
	// Images are OCI archives (make image-offline) that a kubelet node
	// imports into containerd.
	Images []string
	// SkipBuild reuses the binaries in <state>/bin.
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

// NodePidFile is the node process's pid file.
func (s *State) NodePidFile() string { return filepath.Join(s.PidDir(), NodeProcess+".pid") }

// PodsDir holds one dir per pod: hosts, service-account files, container logs.
func (s *State) PodsDir() string { return filepath.Join(s.StateDir, "pods") }

// Network describes the pod network for package netns.
func (s *State) Network() netns.Network {
	return netns.Network{Bridge: s.Bridge, Prefix: s.NetnsPrefix, CIDR: s.PodCIDR, Gateway: s.Gateway,
		ServiceCIDR: s.ServiceCIDR, ServiceAddress: s.ServiceAddress}
}

func newState(o Options) (*State, error) {
	s := &State{}
	s.StateDir = o.StateDir
	s.NodeName = cmpOr(o.NodeName, "local-node")
	s.PodCIDR = cmpOr(o.PodCIDR, "10.244.0.0/16")
	s.ServiceCIDR = cmpOr(o.ServiceCIDR, "10.96.0.0/16")
	s.Bridge = cmpOr(o.Bridge, "obx0")
	s.NetnsPrefix = s.Bridge + "-"
	s.RepoDir = o.RepoDir
	s.BinDir = filepath.Join(o.StateDir, "bin")
	s.Node = cmpOr(o.Node, NodeProcesses)
	if s.Node != NodeProcesses && s.Node != NodeKubelet {
		return nil, fmt.Errorf("node kind %q: must be %s or %s", s.Node, NodeProcesses, NodeKubelet)
	}
	svcIP, err := nthIP(s.ServiceCIDR, 1)
	if err != nil {
		return nil, err
	}
	s.ServiceIP = svcIP
	if s.Gateway, err = nthIP(s.PodCIDR, 1); err != nil {
		return nil, err
	}
	s.AdvertiseAddress = s.Gateway
	if s.Node == NodeKubelet {
		// Pods reach the API server where the kubernetes Service's
		// endpoint is: the host's address on the bridge.
		s.BindAddress = s.Gateway
	}
	if s.ServiceAddress, err = lastIP(s.PodCIDR); err != nil {
		return nil, err
	}
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

// lastIP is the last usable address of cidr (before the broadcast address).
func lastIP(cidr string) (string, error) {
	_, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return "", err
	}
	ip := ipnet.IP.To4()
	if ip == nil {
		return "", fmt.Errorf("%s: only IPv4 ranges are supported", cidr)
	}
	out := make(net.IP, 4)
	for i := range out {
		out[i] = ip[i] | ^ipnet.Mask[i]
	}
	out[3]--
	return out.String(), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Up starts what is not running yet and waits until the node is Ready. A
// cluster that runs already is reused as it is.
func Up(ctx context.Context, o Options) (*State, error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root: it creates network namespaces, veth pairs and a bridge")
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return nil, err
	}
	// Pods run as their runAsUser and must reach the binaries under the state dir.
	if err := os.Chmod(o.StateDir, 0o755); err != nil {
		return nil, err
	}
	s, err := Load(o.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		if s, err = newState(o); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if o.RepoDir != "" {
		s.RepoDir = o.RepoDir
	}
	if s.Node == "" { // a state dir of before the kubelet node
		s.Node = NodeProcesses
	}
	realNode := s.Node == NodeKubelet
	if s.AssetsDir, err = assets(ctx, o, s.RepoDir, realNode); err != nil {
		return nil, err
	}
	if err := s.save(); err != nil {
		return nil, err
	}
	nodePid, nodeAlive := supervise.AliveFromFile(s.NodePidFile())
	// Built every time (seconds when cached): a running node keeps its binary,
	// new pods get the new ones.
	if !o.SkipBuild {
		start := time.Now()
		_, _ = fmt.Fprintf(out, "Building the binaries into %s ...\n", s.BinDir)
		if err := build(ctx, s.RepoDir, s.BinDir); err != nil {
			return nil, err
		}
		if realNode {
			if err := buildStatic(ctx, s.RepoDir, s.BinDir, "./test/localcluster/pause"); err != nil {
				return nil, err
			}
		}
		_, _ = fmt.Fprintf(out, "Built in %s.\n", time.Since(start).Round(100*time.Millisecond))
	}
	if realNode {
		// The API server listens on the bridge's address.
		if err := netns.EnsureBridge(s.Network()); err != nil {
			return s, err
		}
	}
	started, err := controlplane.Start(ctx, s.Config)
	for _, name := range started {
		_, _ = fmt.Fprintf(out, "Started %s (log: %s).\n", name, filepath.Join(s.LogDir(), name+".log"))
	}
	if err != nil {
		return s, err
	}
	if realNode {
		return s, upKubelet(ctx, s, o.Images, out)
	}
	if !nodeAlive {
		pid, err := supervise.Start(supervise.Spec{
			Name: NodeProcess, Path: filepath.Join(s.BinDir, "localcluster"),
			Args: []string{"node", "--state-dir", s.StateDir},
		}, s.PidDir(), s.LogDir())
		if err != nil {
			return s, err
		}
		nodePid = pid
		_, _ = fmt.Fprintf(out, "Started the node %s (pid %d, log: %s).\n", s.NodeName, pid, filepath.Join(s.LogDir(), NodeProcess+".log"))
	}
	if err := waitNodeReady(ctx, s, nodePid, NodeProcess); err != nil {
		return s, err
	}
	return s, nil
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

// assets finds the control plane binaries (and the node's, withNode).
func assets(ctx context.Context, o Options, repo string, withNode bool) (string, error) {
	if o.AssetsDir != "" {
		return o.AssetsDir, nil
	}
	if d := os.Getenv(EnvAssets); d != "" {
		return d, nil
	}
	flag := "--with-control-plane"
	if withNode {
		flag = "--with-node"
	}
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack/setup-envtest.sh"), flag)
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-envtest.sh --with-control-plane: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// buildStatic compiles one program of this repo without cgo into dir, for an
// image with nothing else in it.
func buildStatic(ctx context.Context, repo, dir, pkg string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return nil
}

// buildPackages are what build compiles: every binary of cmd/ (the
// operator's), of examples/orders/cmd/ (the sample application's, which the
// node runs for the sample's image) and the localcluster command.
var buildPackages = []string{"./cmd/...", "./examples/orders/cmd/...", "./hack/localcluster"}

// build compiles buildPackages into dir.
func build(ctx context.Context, repo, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, buildPackages...)...)
	cmd.Dir = repo
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
	if s.Node == NodeKubelet {
		maps.Copy(m, kubelet.Running(s.KubeletConfig()))
		return m
	}
	_, m[NodeProcess] = supervise.AliveFromFile(s.NodePidFile())
	return m
}

// Down stops the node (which stops its pods and removes their namespaces) and
// the control plane by pid, stops any pod process the node left behind, removes
// the pod network and, unless keepState, the state dir.
func Down(s *State, keepState bool) error {
	var errs []error
	if s.Node == NodeKubelet {
		// The kubelet and containerd first: the CNI plugins release the pods'
		// addresses while the bridge is still there.
		errs = append(errs, kubelet.Stop(s.KubeletConfig()))
	} else {
		errs = append(errs, supervise.Stop(s.NodePidFile(), 60*time.Second), stopLeftoverPods(s))
	}
	errs = append(errs, controlplane.Stop(s.Config), netns.Teardown(s.Network()))
	// Extra processes the demo recorded (its PostgreSQL and Redis), listed after
	// the stops above, which remove the pid files of what they stopped.
	extra, _ := filepath.Glob(filepath.Join(s.PidDir(), "*.pid"))
	errs = slices.Grow(errs, len(extra))
	for _, f := range extra {
		errs = append(errs, supervise.Stop(f, 30*time.Second))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if keepState {
		return nil
	}
	return os.RemoveAll(s.StateDir)
}

// stopLeftoverPods stops container processes whose pid files remain, which
// happens only when the node process died without stopping them.
func stopLeftoverPods(s *State) error {
	files, _ := filepath.Glob(filepath.Join(s.PodsDir(), "*", "*.pid"))
	errs := make([]error, 0, len(files))
	for _, f := range files {
		errs = append(errs, supervise.Stop(f, 5*time.Second))
	}
	return errors.Join(errs...)
}
