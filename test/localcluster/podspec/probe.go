package podspec

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProbeTarget is a probe with its defaults applied and its ports resolved.
type ProbeTarget struct {
	Kind    string // "http", "tcp", "exec" or "grpc"
	URL     string // http: scheme://host:port/path
	Headers map[string]string
	Addr    string   // tcp and grpc: host:port
	Command []string // exec

	InitialDelay, Period, Timeout time.Duration
	SuccessThreshold              int
	FailureThreshold              int
}

// Probe resolves probe p of container c for a pod at podIP, with the API's
// defaults (period 10s, timeout 1s, thresholds 1 and 3).
func Probe(p *corev1.Probe, c *corev1.Container, podIP string) (ProbeTarget, error) {
	t := ProbeTarget{
		InitialDelay:     time.Duration(p.InitialDelaySeconds) * time.Second,
		Period:           seconds(p.PeriodSeconds, 10),
		Timeout:          seconds(p.TimeoutSeconds, 1),
		SuccessThreshold: int(max(p.SuccessThreshold, 1)),
		FailureThreshold: int(max(p.FailureThreshold, 1)),
	}
	if p.FailureThreshold == 0 {
		t.FailureThreshold = 3
	}
	switch {
	case p.HTTPGet != nil:
		h := p.HTTPGet
		port, err := ResolvePort(h.Port, c)
		if err != nil {
			return t, err
		}
		host := podIP
		if h.Host != "" {
			host = h.Host
		}
		scheme := strings.ToLower(string(h.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := h.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		t.Kind = "http"
		t.URL = fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path)
		t.Headers = map[string]string{}
		for _, hd := range h.HTTPHeaders {
			t.Headers[hd.Name] = hd.Value
		}
	case p.TCPSocket != nil:
		port, err := ResolvePort(p.TCPSocket.Port, c)
		if err != nil {
			return t, err
		}
		host := podIP
		if p.TCPSocket.Host != "" {
			host = p.TCPSocket.Host
		}
		t.Kind = "tcp"
		t.Addr = net.JoinHostPort(host, strconv.Itoa(port))
	case p.Exec != nil:
		t.Kind = "exec"
		t.Command = p.Exec.Command
	case p.GRPC != nil:
		t.Kind = "grpc"
		t.Addr = net.JoinHostPort(podIP, strconv.Itoa(int(p.GRPC.Port)))
	default:
		return t, fmt.Errorf("probe of container %s has no handler", c.Name)
	}
	return t, nil
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// ResolvePort turns a port number or the name of one of c's ports into a number.
func ResolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("invalid port %d", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}

// ProbeResult accumulates consecutive outcomes against the thresholds.
type ProbeResult struct {
	successes, failures int
	// OK is the probe's current verdict.
	OK bool
}

// Observe records one outcome and reports whether the verdict changed.
func (r *ProbeResult) Observe(t ProbeTarget, success bool) (changed bool) {
	if success {
		r.successes++
		r.failures = 0
		if !r.OK && r.successes >= t.SuccessThreshold {
			r.OK = true
			return true
		}
		return false
	}
	r.failures++
	r.successes = 0
	if r.OK && r.failures >= t.FailureThreshold {
		r.OK = false
		return true
	}
	return false
}

// Failed reports whether failures reached the threshold (liveness: restart).
func (r *ProbeResult) Failed(t ProbeTarget) bool { return r.failures >= t.FailureThreshold }
