package kubelet

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
)

// Bridge is the host's Linux bridge of the pod network. It is made before the
// control plane starts, since the API server listens on its address (pods
// reach the API server there, and a node address may not be loopback); the
// CNI bridge plugin then attaches each pod's veth to it.
type Bridge struct {
	// Name is at most 15 characters (an interface name).
	Name string
	// CIDR is the pod range; Gateway, its first address, is the bridge's.
	CIDR, Gateway string
	// LegacyPrefix named the network namespaces and veths of an older
	// checkout's process node (empty: none); RemoveBridge deletes any left.
	LegacyPrefix string
}

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

// EnsureBridge creates the bridge with the gateway address unless it exists,
// and sets it up.
func EnsureBridge(b Bridge) error {
	if len(b.Name) > 15 {
		return fmt.Errorf("bridge name %q is longer than 15 characters", b.Name)
	}
	_, ipnet, err := net.ParseCIDR(b.CIDR)
	if err != nil {
		return fmt.Errorf("pod range %q: %w", b.CIDR, err)
	}
	ones, _ := ipnet.Mask.Size()
	if !linkExists(b.Name) {
		if err := ip("link", "add", b.Name, "type", "bridge"); err != nil {
			return err
		}
		if err := ip("addr", "add", fmt.Sprintf("%s/%d", b.Gateway, ones), "dev", b.Name); err != nil {
			return err
		}
	}
	return ip("link", "set", b.Name, "up")
}

// RemoveBridge deletes the bridge and, for a cluster of an older checkout,
// the network namespaces and veths of its process node. Missing ones are not
// an error.
func RemoveBridge(b Bridge) error {
	var errs []error
	if b.LegacyPrefix != "" {
		entries, _ := os.ReadDir("/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), b.LegacyPrefix) {
				errs = append(errs, ip("netns", "del", e.Name()))
			}
		}
		ifaces, _ := net.Interfaces()
		for _, i := range ifaces {
			if strings.HasPrefix(i.Name, b.LegacyPrefix+"v") {
				errs = append(errs, ip("link", "del", i.Name))
			}
		}
	}
	if linkExists(b.Name) {
		errs = append(errs, ip("link", "del", b.Name))
	}
	return errors.Join(errs...)
}
