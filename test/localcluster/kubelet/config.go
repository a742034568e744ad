// Package kubelet runs the local cluster's real node: containerd 1.6 with its
// CRI plugin and runc, pod networking from the standard CNI plugins (bridge,
// host-local, loopback, portmap), a kubelet built from k8s.io/kubernetes,
// registered as system:node:<name> like the node of any cluster, and
// kube-proxy in iptables mode for Services. Pods are
// real containers of real images: the project's image built from its
// Dockerfile (make image-offline) and a pause image made here.
//
// Every file the node writes lives under <state>/node; every process is
// recorded by pid (package supervise); Stop removes the pods through the CRI
// (so the CNI plugins release their addresses and namespaces), stops the
// kubelet, kube-proxy and containerd, kills any shim left, unmounts what is
// still mounted under the state dir and removes the node's cgroups and
// iptables chains (kube-proxy --cleanup removes its own).
//
// The three settings this kind of machine needs (TESTING.md): the kubelet
// accepts the hybrid cgroup v1 hierarchy (failCgroupV1: false, the cgroupfs
// driver), containerd never asks runc to lower oom_score_adj
// (restrict_oom_score_adj), and the runtime is runc.
package kubelet

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Process names: their pid files and logs.
const (
	Containerd = "containerd"
	Kubelet    = "kubelet"
	KubeProxy  = "kube-proxy"
)

// PauseImage is the sandbox image, made by WritePauseArchive: never pulled.
const PauseImage = "localhost/outbox-local-cluster/pause:3.10"

// CRINamespace is containerd's namespace of the CRI plugin (ctr -n).
const CRINamespace = "k8s.io"

// CNIBinDir holds Debian's CNI plugins (containernetworking-plugins).
const CNIBinDir = "/usr/lib/cni"

// iptables is the program (and its Debian package) that kube-proxy, the
// CNI plugins and Stop use, and kube-proxy's mode.
const iptables = "iptables"

// cniType is the key of a CNI plugin's configuration that names the plugin.
const cniType = "type"

// Debian packages the node needs (Preflight names them).
const (
	pkgContainerd = "containerd"
	pkgCNI        = "containernetworking-plugins"
)

// Config is the node's shape, filled by package cluster from its state.
type Config struct {
	// StateDir is the cluster's state dir; the node keeps its files in
	// <StateDir>/node.
	StateDir string
	// AssetsDir holds the kubelet binary (hack/setup-envtest.sh --with-node).
	AssetsDir string
	NodeName  string
	// NodeIP is the host's address on the pod bridge (the kubelet's
	// InternalIP; a node IP may not be loopback). The kubelet API listens there.
	NodeIP string
	// Bridge is the pod bridge, PodCIDR its range; the CNI bridge plugin puts
	// each pod's veth on it.
	Bridge  string
	PodCIDR string
	// ClusterDNS is the address pods get as their nameserver.
	ClusterDNS  string
	KubeletPort int
	// HealthzPort is the kubelet's /healthz on 127.0.0.1.
	HealthzPort int
	// ServiceCIDR is the Services' range; ProxyHealthzPort and
	// ProxyMetricsPort are kube-proxy's, on 127.0.0.1.
	ServiceCIDR                        string
	ProxyHealthzPort, ProxyMetricsPort int
	// PKIDir holds ca.crt and the kubelet's serving certificate (kubelet.crt).
	PKIDir string
	// Kubeconfig is the kubelet's (system:node:<NodeName>), ProxyKubeconfig
	// kube-proxy's (system:kube-proxy).
	Kubeconfig      string
	ProxyKubeconfig string
	PidDir, LogDir  string
	// PauseBinary is the sandbox's program (test/localcluster/pause, built
	// static), packed into PauseImage by Start.
	PauseBinary string
	// CgroupRoot is the cgroup under which the kubelet puts every pod, created
	// by Start and removed by Stop (default /outbox-local-cluster).
	CgroupRoot string
}

// Dir is where the node keeps its files.
func (c Config) Dir() string { return filepath.Join(c.StateDir, "node") }

// ContainerdSocket is containerd's gRPC socket (the CRI endpoint).
func (c Config) ContainerdSocket() string {
	return filepath.Join(c.Dir(), "containerd", "containerd.sock")
}

func (c Config) containerdConfigPath() string {
	return filepath.Join(c.Dir(), "containerd", "config.toml")
}
func (c Config) cniConfDir() string        { return filepath.Join(c.Dir(), "cni", "net.d") }
func (c Config) kubeletConfigPath() string { return filepath.Join(c.Dir(), "kubelet", "config.yaml") }
func (c Config) kubeletRootDir() string    { return filepath.Join(c.Dir(), "kubelet", "root") }
func (c Config) resolvConfPath() string    { return filepath.Join(c.Dir(), "kubelet", "resolv.conf") }
func (c Config) proxyConfigPath() string   { return filepath.Join(c.Dir(), "kube-proxy", "config.yaml") }
func (c Config) cgroupRoot() string {
	if c.CgroupRoot != "" {
		return c.CgroupRoot
	}
	return "/outbox-local-cluster"
}

// containerdConfig is containerd's config.toml (version 2, containerd 1.6):
// its root, state and socket under the node's dir, the CRI plugin with runc,
// the overlayfs snapshotter, the local pause image and the CNI config dir.
func (c Config) containerdConfig() string {
	d := filepath.Join(c.Dir(), "containerd")
	q := strconv.Quote
	return strings.Join([]string{
		"# Written by the local cluster (test/localcluster/kubelet). Do not edit.",
		"version = 2",
		"root = " + q(filepath.Join(d, "root")),
		"state = " + q(filepath.Join(d, "state")),
		"[grpc]",
		"  address = " + q(c.ContainerdSocket()),
		"[ttrpc]",
		"  address = " + q(c.ContainerdSocket()+".ttrpc"),
		"[metrics]",
		`  address = ""`,
		`[plugins."io.containerd.grpc.v1.cri"]`,
		"  sandbox_image = " + q(PauseImage),
		// This machine forbids lowering oom_score_adj: without it runc fails
		// with "can't get final child's PID from pipe".
		"  restrict_oom_score_adj = true",
		"  enable_selinux = false",
		`[plugins."io.containerd.grpc.v1.cri".containerd]`,
		`  snapshotter = "overlayfs"`,
		`  default_runtime_name = "runc"`,
		`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]`,
		`  runtime_type = "io.containerd.runc.v2"`,
		`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]`,
		"  SystemdCgroup = false",
		`[plugins."io.containerd.grpc.v1.cri".cni]`,
		"  bin_dir = " + q(CNIBinDir),
		"  conf_dir = " + q(c.cniConfDir()),
		"  max_conf_num = 1",
		"",
	}, "\n")
}

// cniConfig is the pod network's conflist: the bridge plugin on the cluster's
// bridge with host-local addresses from PodCIDR (its state under the node's
// dir) and the bridge's address as the pods' default gateway (Service
// addresses are not on the bridge: kube-proxy's rules on the host translate
// them), then portmap for hostPort. No masquerading: pods reach only the
// machine itself.
func (c Config) cniConfig() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "outbox-local-cluster",
		"plugins": []any{
			map[string]any{
				cniType: "bridge", "bridge": c.Bridge, "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
				"hairpinMode": true,
				"ipam": map[string]any{
					cniType:   "host-local",
					"dataDir": filepath.Join(c.Dir(), "cni", "ipam"),
					"ranges":  []any{[]any{map[string]any{"subnet": c.PodCIDR, "gateway": c.NodeIP}}},
				},
			},
			map[string]any{cniType: "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is the KubeletConfiguration: client certificates of the
// cluster's CA and webhook authorization (so only the API server may use the
// kubelet API), the cgroupfs driver on this host's cgroup v1 hierarchy,
// containerd's socket, cluster DNS, and no image garbage collection (images
// are imported, never pulled).
func (c Config) kubeletConfig() ([]byte, error) {
	cert, key := filepath.Join(c.PKIDir, "kubelet.crt"), filepath.Join(c.PKIDir, "kubelet.key")
	endpoint := "unix://" + c.ContainerdSocket()
	conf := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    c.NodeIP, "port": c.KubeletPort, "readOnlyPort": 0,
		"healthzBindAddress": "127.0.0.1", "healthzPort": c.HealthzPort,
		"tlsCertFile": cert, "tlsPrivateKeyFile": key,
		"authentication": map[string]any{
			"anonymous": map[string]bool{"enabled": false},
			"webhook":   map[string]bool{"enabled": true},
			"x509":      map[string]string{"clientCAFile": filepath.Join(c.PKIDir, "ca.crt")},
		},
		"authorization":            map[string]string{"mode": "Webhook"},
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               c.cgroupRoot(),
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": endpoint,
		"imageServiceEndpoint":     endpoint,
		"clusterDomain":            "cluster.local",
		"clusterDNS":               []string{c.ClusterDNS},
		"resolvConf":               c.resolvConfPath(),
		"podCIDR":                  c.PodCIDR,
		// Images are imported into containerd, never pulled: never collect them.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%", "nodefs.inodesFree": "2%",
		},
		// The kubelet's own iptables chains (KUBE-KUBELET-CANARY...) would
		// outlive the cluster; kube-proxy owns the rules pods need.
		"makeIPTablesUtilChains": false,
		"serializeImagePulls":    false,
		"shutdownGracePeriod":    "0s",
		"enableServer":           true,
		"registerNode":           true,
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletArgs are the kubelet's flags; everything else is in its config file.
func (c Config) kubeletArgs() []string {
	return []string{
		"--config=" + c.kubeletConfigPath(),
		"--kubeconfig=" + c.Kubeconfig,
		"--root-dir=" + c.kubeletRootDir(),
		"--cert-dir=" + filepath.Join(c.Dir(), "kubelet", "pki"),
		"--node-ip=" + c.NodeIP,
		"--hostname-override=" + c.NodeName,
		"--v=1",
	}
}

// proxyConfig is kube-proxy's KubeProxyConfiguration: iptables mode, the
// pod range as the cluster's (traffic from elsewhere, the host's, is
// masqueraded), health and metrics on loopback, NodePorts on the node's
// address only. It changes no sysctl: conntrack's limits and timeouts are
// left as the host has them, and localhost NodePorts (which need
// route_localnet) are off.
func (c Config) proxyConfig() ([]byte, error) {
	loop := "127.0.0.1:"
	conf := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": c.ProxyKubeconfig},
		"mode":               iptables,
		"clusterCIDR":        c.PodCIDR,
		"hostnameOverride":   c.NodeName,
		"bindAddress":        c.NodeIP,
		"healthzBindAddress": loop + strconv.Itoa(c.ProxyHealthzPort),
		"metricsBindAddress": loop + strconv.Itoa(c.ProxyMetricsPort),
		"nodePortAddresses":  []string{c.NodeIP + "/32"},
		"iptables":           map[string]any{"localhostNodePorts": false, "masqueradeAll": false},
		"conntrack": map[string]any{
			"maxPerCore": 0, "min": 0,
			"tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// proxyArgs are kube-proxy's flags; everything else is in its config file.
func (c Config) proxyArgs() []string {
	return []string{"--config=" + c.proxyConfigPath(), "--v=1"}
}

// String is for error messages.
func (c Config) String() string {
	return fmt.Sprintf("node %s (%s, kubelet :%d)", c.NodeName, c.NodeIP, c.KubeletPort)
}
