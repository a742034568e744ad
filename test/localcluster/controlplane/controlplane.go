// Package controlplane runs a real Kubernetes control plane as host processes:
// etcd, kube-apiserver, kube-controller-manager and kube-scheduler, every one
// bound to 127.0.0.1 (the API server to Config.BindAddress when set: the real
// node's pods reach it there), with certificates and kubeconfigs generated on
// the spot (package pki).
//
// Each component is started detached (package supervise), its pid recorded in
// <state>/pids and its output in <state>/logs, so that a later process (the
// `down` command) can stop it by pid. Start is idempotent: a component whose
// pid is alive is kept.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/pki"
	"github.com/outbox-dev/outbox-operator/test/localcluster/supervise"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Component names, also the names of their pid files and logs.
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// Components in start order; stop in reverse.
var Components = []string{Etcd, APIServer, ControllerManager, Scheduler}

// Kubeconfig names under <state>/kubeconfigs (admin is <state>/kubeconfig).
const (
	KubeconfigControllerManager = "kube-controller-manager"
	KubeconfigScheduler         = "kube-scheduler"
	// KubeconfigKubelet is the real kubelet's: system:node:<name> in
	// system:nodes, as the Node authorizer and NodeRestriction expect.
	KubeconfigKubelet = "kubelet-client"
	// KubeconfigProxy is kube-proxy's: system:kube-proxy, which the default
	// ClusterRoleBinding system:node-proxier grants what it reads.
	KubeconfigProxy = "kube-proxy"
)

// systemMasters is the group the API server grants every permission; the
// clients of the control plane and the local admin belong to it.
const systemMasters = "system:masters"

// Config is the control plane's shape. Ports are chosen once (FreePort) and
// kept in the cluster's state so that a restart reuses them.
type Config struct {
	StateDir    string
	AssetsDir   string // holds etcd, kube-apiserver, kube-controller-manager, kube-scheduler
	NodeName    string
	ServiceCIDR string // e.g. 10.96.0.0/16; its first address is the kubernetes Service
	PodCIDR     string // e.g. 10.244.0.0/16
	// ServiceIP is the ClusterIP of the kubernetes Service (first address of ServiceCIDR).
	ServiceIP string
	// AdvertiseAddress is the API server's address in the kubernetes Service's
	// endpoints. It may not be loopback; the local cluster uses the pod
	// network's gateway, the host's address on the pod bridge.
	AdvertiseAddress string
	// BindAddress is where the API server listens (default 127.0.0.1). The
	// local cluster sets it to AdvertiseAddress: kube-proxy sends the
	// kubernetes Service's traffic there, and a pod cannot reach the host's
	// loopback.
	BindAddress string `json:",omitempty"`

	EtcdPort, EtcdPeerPort, APIServerPort, ControllerManagerPort, SchedulerPort int
}

// PKIDir, LogDir, PidDir and the admin kubeconfig's path.
func (c Config) PKIDir() string     { return filepath.Join(c.StateDir, "pki") }
func (c Config) LogDir() string     { return filepath.Join(c.StateDir, "logs") }
func (c Config) PidDir() string     { return filepath.Join(c.StateDir, "pids") }
func (c Config) Kubeconfig() string { return filepath.Join(c.StateDir, "kubeconfig") }

// ComponentKubeconfig is the kubeconfig of a component (KubeconfigKubelet, ...).
func (c Config) ComponentKubeconfig(name string) string {
	return filepath.Join(c.StateDir, "kubeconfigs", name)
}

// Server is the API server's URL.
func (c Config) Server() string {
	return "https://" + net.JoinHostPort(c.apiServerAddress(), strconv.Itoa(c.APIServerPort))
}

// apiServerAddress is the API server's BindAddress, 127.0.0.1 by default.
func (c Config) apiServerAddress() string {
	if c.BindAddress != "" {
		return c.BindAddress
	}
	return loopback
}

// loopback is where every component but the API server listens.
const loopback = "127.0.0.1"

// Certs lists every certificate of the cluster. The node's serving certificate
// is for the kubelet API on 127.0.0.1, where the API server reaches it for logs.
func (c Config) Certs() []pki.Cert {
	return []pki.Cert{
		{Name: "apiserver", CommonName: "kube-apiserver", Server: true,
			DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			IPs:      []net.IP{net.ParseIP(loopback), net.ParseIP(c.ServiceIP), net.ParseIP(c.AdvertiseAddress)}},
		{Name: "apiserver-kubelet-client", CommonName: "kube-apiserver-kubelet-client", Organizations: []string{systemMasters}, Client: true},
		{Name: "admin", CommonName: "local-admin", Organizations: []string{systemMasters}, Client: true},
		{Name: KubeconfigControllerManager, CommonName: "system:kube-controller-manager", Client: true},
		{Name: KubeconfigScheduler, CommonName: "system:kube-scheduler", Client: true},
		{Name: KubeconfigKubelet, CommonName: "system:node:" + c.NodeName, Organizations: []string{"system:nodes"}, Client: true},
		{Name: KubeconfigProxy, CommonName: "system:kube-proxy", Client: true},
		// The kubelet API, on the node's address (the pod network's gateway).
		{Name: "kubelet", CommonName: c.NodeName, Server: true,
			DNSNames: []string{"localhost", c.NodeName}, IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(c.AdvertiseAddress)}},
	}
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Prepare writes the PKI and kubeconfigs (kept when they exist).
func Prepare(c Config) error {
	if err := pki.Ensure(c.PKIDir(), c.Certs()); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.ComponentKubeconfig("x")), 0o700); err != nil {
		return err
	}
	if err := writeKubeconfig(c, c.Kubeconfig(), "admin"); err != nil {
		return err
	}
	for _, name := range []string{KubeconfigControllerManager, KubeconfigScheduler, KubeconfigKubelet, KubeconfigProxy} {
		if err := writeKubeconfig(c, c.ComponentKubeconfig(name), name); err != nil {
			return err
		}
	}
	return nil
}

func writeKubeconfig(c Config, path, certName string) error {
	cert, key := pki.Files(c.PKIDir(), certName)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Server(), CertificateAuthority: filepath.Join(c.PKIDir(), pki.CACert)}
	cfg.AuthInfos[certName] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: certName, Namespace: "default"}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, path)
}

func (c Config) spec(name string) supervise.Spec {
	p := func(f string) string { return filepath.Join(c.PKIDir(), f) }
	ca := p(pki.CACert)
	loop := loopback
	switch name {
	case Etcd:
		client := "http://" + net.JoinHostPort(loop, strconv.Itoa(c.EtcdPort))
		peer := "http://" + net.JoinHostPort(loop, strconv.Itoa(c.EtcdPeerPort))
		return supervise.Spec{Name: name, Path: filepath.Join(c.AssetsDir, "etcd"), Args: []string{
			"--name=local", "--data-dir=" + filepath.Join(c.StateDir, "etcd"),
			"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=local=" + peer, "--listen-metrics-urls=",
			"--unsafe-no-fsync=true", "--log-level=warn",
		}}
	case APIServer:
		cert, key := pki.Files(c.PKIDir(), "apiserver")
		kcert, kkey := pki.Files(c.PKIDir(), "apiserver-kubelet-client")
		issuer := "https://kubernetes.default.svc.cluster.local"
		return supervise.Spec{Name: name, Path: filepath.Join(c.AssetsDir, "kube-apiserver"), Args: []string{
			"--etcd-servers=http://" + net.JoinHostPort(loop, strconv.Itoa(c.EtcdPort)),
			"--bind-address=" + c.apiServerAddress(), "--advertise-address=" + c.AdvertiseAddress,
			"--secure-port=" + strconv.Itoa(c.APIServerPort),
			"--tls-cert-file=" + cert, "--tls-private-key-file=" + key,
			"--client-ca-file=" + ca,
			"--service-account-issuer=" + issuer, "--api-audiences=" + issuer,
			"--service-account-key-file=" + p(pki.ServiceAccPub),
			"--service-account-signing-key-file=" + p(pki.ServiceAccKey),
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			"--service-cluster-ip-range=" + c.ServiceCIDR,
			"--kubelet-client-certificate=" + kcert, "--kubelet-client-key=" + kkey,
			"--kubelet-certificate-authority=" + ca,
			"--kubelet-preferred-address-types=InternalIP",
			"--allow-privileged=true",
			"--endpoint-reconciler-type=lease",
			"--profiling=false",
		}}
	case ControllerManager:
		kc := c.ComponentKubeconfig(KubeconfigControllerManager)
		return supervise.Spec{Name: name, Path: filepath.Join(c.AssetsDir, "kube-controller-manager"), Args: []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=" + loop, "--secure-port=" + strconv.Itoa(c.ControllerManagerPort),
			"--service-account-private-key-file=" + p(pki.ServiceAccKey),
			"--root-ca-file=" + ca,
			"--cluster-signing-cert-file=" + ca, "--cluster-signing-key-file=" + p(pki.CAKey),
			"--use-service-account-credentials=true",
			"--controllers=*",
			"--leader-elect=false",
			"--cluster-cidr=" + c.PodCIDR, "--service-cluster-ip-range=" + c.ServiceCIDR,
			"--allocate-node-cidrs=false",
			"--profiling=false",
		}}
	case Scheduler:
		kc := c.ComponentKubeconfig(KubeconfigScheduler)
		return supervise.Spec{Name: name, Path: filepath.Join(c.AssetsDir, "kube-scheduler"), Args: []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=" + loop, "--secure-port=" + strconv.Itoa(c.SchedulerPort),
			"--leader-elect=false", "--profiling=false",
		}}
	}
	panic("unknown component " + name)
}

// Start starts every component that is not running yet, in order, waiting for
// each to be healthy before the next. It returns the names it started.
func Start(ctx context.Context, c Config) ([]string, error) {
	if err := Prepare(c); err != nil {
		return nil, err
	}
	var started []string
	for _, name := range Components {
		spec := c.spec(name)
		if _, err := os.Stat(spec.Path); err != nil {
			return started, fmt.Errorf("%s: %w (hack/setup-envtest.sh --with-control-plane provides it)", name, err)
		}
		if _, alive := supervise.AliveFromFile(filepath.Join(c.PidDir(), name+".pid")); !alive {
			if _, err := supervise.Start(spec, c.PidDir(), c.LogDir()); err != nil {
				return started, err
			}
			started = append(started, name)
		}
		if err := waitHealthy(ctx, c, name); err != nil {
			return started, fmt.Errorf("%s did not become healthy: %w (log: %s)", name, err, filepath.Join(c.LogDir(), name+".log"))
		}
	}
	return started, nil
}

// Stop stops every component by its pid, in reverse order.
func Stop(c Config) error {
	var errs []error
	for i := len(Components) - 1; i >= 0; i-- {
		errs = append(errs, supervise.Stop(filepath.Join(c.PidDir(), Components[i]+".pid"), 20*time.Second))
	}
	return errors.Join(errs...)
}

// Running reports, per component, whether its process is alive.
func Running(c Config) map[string]bool {
	m := map[string]bool{}
	for _, name := range Components {
		_, m[name] = supervise.AliveFromFile(filepath.Join(c.PidDir(), name+".pid"))
	}
	return m
}

func waitHealthy(ctx context.Context, c Config, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var url string
	client := &http.Client{Timeout: 3 * time.Second}
	switch name {
	case Etcd:
		url = fmt.Sprintf("http://127.0.0.1:%d/health", c.EtcdPort)
	case APIServer:
		cert, key := pki.Files(c.PKIDir(), "admin")
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return err
		}
		// The admin's client certificate; the CA is ours, but /readyz only
		// needs to answer: skip verification of this loopback call.
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{ //nolint:gosec // loopback health check
			Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true,
		}}
		url = c.Server() + "/readyz"
	case ControllerManager, Scheduler:
		port := c.ControllerManagerPort
		if name == Scheduler {
			port = c.SchedulerPort
		}
		// A self-signed serving certificate on loopback.
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // see above
		url = fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	}
	pidFile := filepath.Join(c.PidDir(), name+".pid")
	var last error
	for {
		if _, alive := supervise.AliveFromFile(pidFile); !alive {
			return errors.New("the process exited")
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s answered %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
