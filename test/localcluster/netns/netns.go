// Package netns gives each pod of the local cluster its own network namespace
// on a bridge of the host, and lets the node open sockets inside a namespace.
//
// The pod network is a Linux bridge (Network.Bridge) holding the first address
// of Network.CIDR (the gateway); each pod gets a namespace
// <prefix><id>, a veth pair whose host end (<prefix>v<id>) is on the bridge and
// whose other end is the pod's eth0 with the pod's address. Pods have no
// default route: they reach each other and the host's bridge address only.
// One more namespace on the bridge, <prefix>svc, holds the whole service range
// as local addresses (a "local" route to lo), so that the node's service proxy
// can listen there on any ClusterIP; every pod routes the service range to it.
//
// Namespaces and links are managed with iproute2 (`ip`), which every Debian
// machine has.
package netns

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Network is the shape of the pod network.
type Network struct {
	Bridge      string // at most 5 characters, so that veth names fit in 15
	Prefix      string // prefix of namespace and host-side veth names
	CIDR        string // pod addresses, e.g. 10.244.0.0/16
	Gateway     string // the bridge's address, the first of CIDR
	ServiceCIDR string // ClusterIPs: local in the services namespace, routed there from pods
	// ServiceAddress is the services namespace's address on the bridge.
	ServiceAddress string
}

// ServiceID is the id of the services namespace.
const ServiceID = "svc"

// podVeth is the pod's end of its veth pair, inside the pod's namespace.
const podVeth = "eth0"

// NamespacePath is where `ip netns` keeps a named namespace.
func NamespacePath(name string) string { return filepath.Join("/run/netns", name) }

// Name is the namespace of the pod with the given id (8 hex digits).
func (n Network) Name(id string) string { return n.Prefix + id }

// HostVeth is the host end of the pod's veth pair.
func (n Network) HostVeth(id string) string { return n.Prefix + "v" + id }

func ip(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func prefixLen(cidr string) (int, error) {
	_, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return 0, err
	}
	ones, _ := ipnet.Mask.Size()
	return ones, nil
}

// EnsureBridge creates the bridge with the gateway address unless it exists.
func EnsureBridge(n Network) error {
	if len(n.Bridge) > 5 {
		return fmt.Errorf("bridge name %q is longer than 5 characters", n.Bridge)
	}
	ones, err := prefixLen(n.CIDR)
	if err != nil {
		return err
	}
	if !linkExists(n.Bridge) {
		if err := ip("link", "add", n.Bridge, "type", "bridge"); err != nil {
			return err
		}
		if err := ip("addr", "add", fmt.Sprintf("%s/%d", n.Gateway, ones), "dev", n.Bridge); err != nil {
			return err
		}
	}
	return ip("link", "set", n.Bridge, "up")
}

// Create makes the namespace of pod id with address addr, its veth pair on
// the bridge, lo up, and the service range routed to lo.
func Create(n Network, id, addr string) error {
	ones, err := prefixLen(n.CIDR)
	if err != nil {
		return err
	}
	name, veth := n.Name(id), n.HostVeth(id)
	// A namespace left by a previous run of this pod id goes first.
	_ = Delete(n, id)
	steps := [][]string{
		{"netns", "add", name},
		{"link", "add", veth, "type", "veth", "peer", "name", podVeth, "netns", name},
		{"link", "set", veth, "master", n.Bridge},
		{"link", "set", veth, "up"},
		{"-n", name, "addr", "add", fmt.Sprintf("%s/%d", addr, ones), "dev", podVeth},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "link", "set", podVeth, "up"},
	}
	if id == ServiceID {
		steps = append(steps, []string{"-n", name, "route", "add", "local", n.ServiceCIDR, "dev", "lo"})
	} else {
		steps = append(steps, []string{"-n", name, "route", "add", n.ServiceCIDR, "via", n.ServiceAddress})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			_ = Delete(n, id)
			return err
		}
	}
	return nil
}

// Delete removes the namespace of pod id and its veth pair. Missing ones are
// not an error.
func Delete(n Network, id string) error {
	var errs []error
	if linkExists(n.HostVeth(id)) {
		errs = append(errs, ip("link", "del", n.HostVeth(id)))
	}
	if _, err := os.Stat(NamespacePath(n.Name(id))); err == nil {
		errs = append(errs, ip("netns", "del", n.Name(id)))
	}
	return errors.Join(errs...)
}

// List returns the ids of the pod namespaces of this network.
func List(n Network) []string {
	entries, _ := os.ReadDir("/run/netns")
	var ids []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), n.Prefix) {
			ids = append(ids, strings.TrimPrefix(e.Name(), n.Prefix))
		}
	}
	return ids
}

// Teardown removes every pod namespace of this network, every veth left on
// the bridge, and the bridge.
func Teardown(n Network) error {
	var errs []error
	for _, id := range List(n) {
		errs = append(errs, Delete(n, id))
	}
	ifaces, _ := net.Interfaces()
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, n.Prefix+"v") {
			errs = append(errs, ip("link", "del", i.Name))
		}
	}
	if linkExists(n.Bridge) {
		errs = append(errs, ip("link", "del", n.Bridge))
	}
	return errors.Join(errs...)
}

// Do runs fn on an OS thread that has joined the network namespace at path.
// Sockets fn opens stay in that namespace after fn returns. The thread is
// discarded afterwards, never reused by other goroutines.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit terminates the thread, which
		// still belongs to the pod's namespace.
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening %s: %w", path, err)
			return
		}
		defer func() { _ = unix.Close(fd) }()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a TCP listener on addr inside the namespace at path.
func Listen(path, addr string) (net.Listener, error) {
	var l net.Listener
	err := Do(path, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}
