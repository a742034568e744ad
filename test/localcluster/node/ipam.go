package node

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
)

// ipam hands out pod addresses from the pod range: the first is the
// gateway, the last the broadcast address and the one before it the services
// namespace's; a released address is reused last.
type ipam struct {
	mu    sync.Mutex
	base  uint32
	size  uint32
	next  uint32
	inUse map[uint32]string
	byPod map[string]uint32
}

func newIPAM(cidr string) (*ipam, error) {
	_, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	ip4 := ipnet.IP.To4()
	if ip4 == nil {
		return nil, fmt.Errorf("%s is not an IPv4 range", cidr)
	}
	ones, bits := ipnet.Mask.Size()
	return &ipam{
		base: binary.BigEndian.Uint32(ip4), size: 1 << (bits - ones), next: 2,
		inUse: map[uint32]string{}, byPod: map[string]uint32{},
	}, nil
}

func (a *ipam) allocate(pod string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if off, ok := a.byPod[pod]; ok {
		return a.ip(off), nil
	}
	for range a.size {
		off := a.next
		a.next++
		if a.next >= a.size-2 {
			a.next = 2
		}
		if _, taken := a.inUse[off]; !taken && off >= 2 && off < a.size-2 {
			a.inUse[off] = pod
			a.byPod[pod] = off
			return a.ip(off), nil
		}
	}
	return "", fmt.Errorf("the pod range is exhausted")
}

func (a *ipam) release(pod string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if off, ok := a.byPod[pod]; ok {
		delete(a.inUse, off)
		delete(a.byPod, pod)
	}
}

func (a *ipam) ip(off uint32) string {
	b := make(net.IP, 4)
	binary.BigEndian.PutUint32(b, a.base+off)
	return b.String()
}
