package node

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// serviceProxy stands in for kube-proxy and cluster DNS. A network namespace
// of its own on the pod bridge (netns.ServiceID) holds the whole service range
// as local addresses, and every pod routes that range to it; the proxy listens
// there on each Service's ClusterIP and port, and relays a connection to a
// ready endpoint of the Service's EndpointSlices. Endpoints that are pod
// addresses are dialled on the pod bridge; the gateway address (the host's
// side of the bridge, also the API server's advertised address) and loopback
// addresses are dialled on the host's 127.0.0.1, which is how pods reach the
// API server and host processes such as the demo's PostgreSQL and Redis. Each
// pod's /etc/hosts resolves Service names to ClusterIPs and is rewritten in
// place when Services change.
type serviceProxy struct {
	services corev1listers.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	gateway  string
	nsPath   string // the services namespace
	log      *slog.Logger

	mu        sync.Mutex
	listeners map[string]net.Listener // key: "ns/name/port"
	pods      map[string]*proxiedPod
}

type proxiedPod struct {
	namespace, hostsPath, podIP, hostname string
}

func newServiceProxy(
	services corev1listers.ServiceLister, sl discoverylisters.EndpointSliceLister, gateway, nsPath string, log *slog.Logger,
) *serviceProxy {
	return &serviceProxy{services: services, slices: sl, gateway: gateway, nsPath: nsPath, log: log,
		listeners: map[string]net.Listener{}, pods: map[string]*proxiedPod{}}
}

// addPod writes the pod's hosts file and keeps it current.
func (p *serviceProxy) addPod(key, namespace, hostsPath, podIP, hostname string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := &proxiedPod{namespace: namespace, hostsPath: hostsPath, podIP: podIP, hostname: hostname}
	p.pods[key] = pp
	if svcs, err := p.services.List(labels.Everything()); err == nil {
		p.writeHosts(pp, svcs)
	}
}

func (p *serviceProxy) removePod(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pods, key)
}

// close stops every listener.
func (p *serviceProxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, l := range p.listeners {
		_ = l.Close()
		delete(p.listeners, k)
	}
}

type svcPort struct {
	svc  *corev1.Service
	port corev1.ServicePort
}

// sync brings the listeners and every pod's hosts file in line with the Services.
func (p *serviceProxy) sync() {
	p.mu.Lock()
	defer p.mu.Unlock()
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		p.log.Error("Listing Services failed", "err", err)
		return
	}
	want := map[string]svcPort{}
	for _, s := range svcs {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		for _, port := range s.Spec.Ports {
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
				continue
			}
			want[fmt.Sprintf("%s/%s/%s/%d", s.Namespace, s.Name, s.Spec.ClusterIP, port.Port)] = svcPort{s, port}
		}
	}
	for key, l := range p.listeners {
		if _, ok := want[key]; !ok {
			_ = l.Close()
			delete(p.listeners, key)
		}
	}
	for key, sp := range want {
		if _, ok := p.listeners[key]; ok {
			continue
		}
		addr := net.JoinHostPort(sp.svc.Spec.ClusterIP, strconv.Itoa(int(sp.port.Port)))
		l, err := netns.Listen(p.nsPath, addr)
		if err != nil {
			p.log.Error("Listening on a ClusterIP failed", "addr", addr, "err", err)
			continue
		}
		p.listeners[key] = l
		go p.serve(l, sp.svc.Namespace, sp.svc.Name, sp.port)
	}
	for _, pp := range p.pods {
		p.writeHosts(pp, svcs)
	}
}

func (p *serviceProxy) writeHosts(pp *proxiedPod, svcs []*corev1.Service) {
	if err := writeInPlace(pp.hostsPath, hostsFile(pp, svcs)); err != nil {
		p.log.Error("Writing hosts file failed", "path", pp.hostsPath, "err", err)
	}
}

// hostsFile renders a pod's /etc/hosts.
func hostsFile(pp *proxiedPod, svcs []*corev1.Service) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by the local cluster's node: Services resolve to their ClusterIPs,\n")
	b.WriteString("# where the node's service proxy listens (no kube-proxy, no DNS).\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	fmt.Fprintf(&b, "%s\t%s\n", pp.podIP, pp.hostname)
	sorted := slices.Clone(svcs)
	slices.SortFunc(sorted, func(a, b *corev1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, s := range sorted {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		names := []string{
			fmt.Sprintf("%s.%s.svc.cluster.local", s.Name, s.Namespace),
			fmt.Sprintf("%s.%s.svc", s.Name, s.Namespace),
			fmt.Sprintf("%s.%s", s.Name, s.Namespace),
		}
		if s.Namespace == pp.namespace {
			names = append(names, s.Name)
		}
		fmt.Fprintf(&b, "%s\t%s\n", s.Spec.ClusterIP, strings.Join(names, " "))
	}
	return b.Bytes()
}

// writeInPlace rewrites a file without replacing its inode, so that a bind
// mount of it sees the new content.
func writeInPlace(path string, content []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	return closeErr(f, err)
}

func closeErr(c io.Closer, err error) error {
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	return err
}

func (p *serviceProxy) serve(l net.Listener, namespace, name string, port corev1.ServicePort) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go p.relay(conn, namespace, name, port)
	}
}

func (p *serviceProxy) relay(conn net.Conn, namespace, name string, port corev1.ServicePort) {
	defer func() { _ = conn.Close() }()
	target, err := p.endpoint(namespace, name, port)
	if err != nil {
		p.log.Info("Refused a connection to a Service without a ready endpoint", "service", namespace+"/"+name, "port", port.Port, "err", err)
		return
	}
	upstream, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.log.Info("Dialling an endpoint failed", "service", namespace+"/"+name, "endpoint", target, "err", err)
		return
	}
	defer func() { _ = upstream.Close() }()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(upstream, conn)
	go pipe(conn, upstream)
	<-done
	<-done
}

// endpoint picks a ready endpoint of the Service port, as host:port to dial
// from the host.
func (p *serviceProxy) endpoint(namespace, name string, port corev1.ServicePort) (string, error) {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name})
	epSlices, err := p.slices.EndpointSlices(namespace).List(sel)
	if err != nil {
		return "", err
	}
	var candidates []string
	for _, sl := range epSlices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var num int32
		for _, sp := range sl.Ports {
			if sp.Port != nil && ptrOr(sp.Name, "") == port.Name {
				num = *sp.Port
			}
		}
		if num == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				candidates = append(candidates, net.JoinHostPort(p.dialAddress(a), strconv.Itoa(int(num))))
			}
		}
	}
	if len(candidates) == 0 {
		return "", fmt.Errorf("no ready endpoint for port %q", port.Name)
	}
	return candidates[rand.IntN(len(candidates))], nil
}

// dialAddress maps the gateway and loopback endpoints to the host's loopback.
func (p *serviceProxy) dialAddress(a string) string {
	if ip := net.ParseIP(a); a == p.gateway || (ip != nil && ip.IsLoopback()) {
		return "127.0.0.1"
	}
	return a
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
