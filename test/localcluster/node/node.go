// Package node is the local cluster's node: a virtual-kubelet node (its node
// and pod controllers, github.com/virtual-kubelet/virtual-kubelet) with a
// provider of our own that runs each pod as host processes.
//
// Each pod gets a network namespace with its own address on the node's bridge
// (package netns), its own /etc/hosts, /run and hostname (the `podexec`
// wrapper), and, when it mounts one, its service-account token at the
// standard path. Containers of this project's image run the binaries built
// from this repo (package podspec maps them); other images fail the pod. A
// service proxy stands in for kube-proxy and DNS (proxy.go). The kubelet API
// (logs, port-forward) is served on 127.0.0.1 with a certificate of the
// cluster's CA and requires the API server's client certificate.
package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
	"github.com/outbox-dev/outbox-operator/test/localcluster/controlplane"
	"github.com/outbox-dev/outbox-operator/test/localcluster/netns"
	"github.com/outbox-dev/outbox-operator/test/localcluster/pki"
	"github.com/outbox-dev/outbox-operator/test/localcluster/podspec"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// HostIP is the node's address: the API server reaches the kubelet API there.
const HostIP = "127.0.0.1"

// ProjectImage describes the operator's image: its binaries, its ENTRYPOINT
// /manager and its USER 65532 (see the Dockerfile's target operator).
func ProjectImage() podspec.Image {
	return podspec.Image{
		Repository: cluster.ProjectImage,
		Entrypoint: []string{"/manager"},
		Binaries:   []string{"/manager", "/relay"},
		User:       65532, Group: 65532,
	}
}

// SampleImage describes the sample application's image (the Dockerfile's
// target sample): orders-api, its ENTRYPOINT, and the worker.
func SampleImage() podspec.Image {
	return podspec.Image{
		Repository: cluster.SampleImage,
		Entrypoint: []string{"/orders-api"},
		Binaries:   []string{"/orders-api", "/worker"},
		User:       65532, Group: 65532,
	}
}

// Run runs the node of the cluster in stateDir until ctx ends, then stops
// every pod and removes the pod network.
func Run(ctx context.Context, stateDir string, log *slog.Logger) error {
	s, err := cluster.Load(stateDir)
	if err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", s.ComponentKubeconfig(controlplane.KubeconfigNode))
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	network := s.Network()
	// Namespaces of a previous run of the node have no processes any more.
	for _, id := range netns.List(network) {
		_ = netns.Delete(network, id)
	}
	if err := netns.EnsureBridge(network); err != nil {
		return err
	}
	defer func() {
		if err := netns.Teardown(network); err != nil {
			log.Error("Removing the pod network failed", "err", err)
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ipam, err := newIPAM(s.PodCIDR)
	if err != nil {
		return err
	}
	// Services and EndpointSlices for the service proxy.
	proxyInformers := informers.NewSharedInformerFactory(client, 10*time.Minute)
	svcInformer := proxyInformers.Core().V1().Services()
	sliceInformer := proxyInformers.Discovery().V1().EndpointSlices()
	if err := netns.Create(network, netns.ServiceID, s.ServiceAddress); err != nil {
		return fmt.Errorf("creating the services namespace: %w", err)
	}
	proxy := newServiceProxy(svcInformer.Lister(), sliceInformer.Lister(), s.Gateway, netns.NamespacePath(network.Name(netns.ServiceID)), log)
	defer proxy.close()
	onChange := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { proxy.sync() },
		UpdateFunc: func(any, any) { proxy.sync() },
		DeleteFunc: func(any) { proxy.sync() },
	}
	if _, err := svcInformer.Informer().AddEventHandler(onChange); err != nil {
		return err
	}
	_ = sliceInformer.Informer()
	proxyInformers.Start(ctx.Done())
	proxyInformers.WaitForCacheSync(ctx.Done())

	var provider *Provider
	newProvider := func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, vknode.NodeProvider, error) {
		provider = &Provider{
			log: log, client: client,
			secrets: cfg.Secrets, configMaps: cfg.ConfigMaps, services: cfg.Services,
			network: network, images: []podspec.Image{ProjectImage(), SampleImage()},
			binDir: s.BinDir, self: self, podsDir: s.PodsDir(), hostIP: HostIP,
			proxy: proxy, ipam: ipam,
			probeClient: &http.Client{
				// Probes skip verification, as the kubelet's do.
				Transport: &http.Transport{
					TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see above
					DisableKeepAlives: true,
				},
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			},
			pods: map[string]*podRun{},
		}
		return provider, nil, nil
	}
	tlsCfg, err := kubeletTLS(s)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	n, err := nodeutil.NewNode(s.NodeName, newProvider,
		nodeutil.WithClient(client),
		nodeutil.AttachProviderRoutes(mux),
		func(cfg *nodeutil.NodeConfig) error {
			cfg.HTTPListenAddr = HostIP + ":" + strconv.Itoa(s.KubeletPort)
			cfg.Handler = mux
			cfg.TLSConfig = tlsCfg
			cfg.SkipDownwardAPIResolution = true
			cfg.NumWorkers = 4
			cfg.InformerResyncPeriod = time.Minute
			describeNode(&cfg.NodeSpec, s)
			return nil
		},
	)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.PodsDir(), 0o755); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- n.Run(runCtx) }()
	if err := n.WaitReady(ctx, time.Minute); err != nil {
		return fmt.Errorf("the node did not start: %w", err)
	}
	log.Info("Node is ready", "node", s.NodeName, "kubeletPort", s.KubeletPort, "bridge", s.Bridge, "podCIDR", s.PodCIDR)
	podLister := podListerFor(ctx, client, s.NodeName)
	gcTick := time.NewTicker(15 * time.Second)
	defer gcTick.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("Stopping every pod of the node")
			provider.stopAll()
			stop()
			<-n.Done()
			return nil
		case err := <-errc:
			provider.stopAll()
			return err
		case <-gcTick.C:
			provider.gc(podLister)
		}
	}
}

// podListerFor watches the pods bound to this node, for the provider's gc.
func podListerFor(ctx context.Context, client kubernetes.Interface, nodeName string) corev1listers.PodLister {
	f := informers.NewSharedInformerFactoryWithOptions(client, time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + nodeName }))
	l := f.Core().V1().Pods().Lister()
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return l
}

func kubeletTLS(s *cluster.State) (*tls.Config, error) {
	cert, key := pki.Files(s.PKIDir(), "kubelet")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(s.PKIDir(), pki.CACert))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// describeNode fills in the Node object the node registers.
func describeNode(n *corev1.Node, s *cluster.State) {
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = runtime.GOARCH
	n.Labels["type"] = "local-cluster"
	n.Labels["node.kubernetes.io/instance-type"] = "local-processes"
	n.Spec.PodCIDR = s.PodCIDR
	n.Spec.PodCIDRs = []string{s.PodCIDR}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("50Gi"),
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: HostIP},
		{Type: corev1.NodeHostName, Address: s.NodeName},
	}
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(s.KubeletPort)}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem: "linux", Architecture: runtime.GOARCH,
		KubeletVersion:          "v1.37.2",
		ContainerRuntimeVersion: "localcluster://processes",
		OSImage:                 "host processes in network namespaces",
	}
	now := metav1.Now()
	conds := make([]corev1.NodeCondition, 0, len(n.Status.Conditions))
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			c.Status = corev1.ConditionFalse
			c.Reason = "KubeletHasNo" + string(c.Type)
			c.LastHeartbeatTime, c.LastTransitionTime = now, now
		}
		conds = append(conds, c)
	}
	n.Status.Conditions = conds
}
