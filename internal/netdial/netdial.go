// Package netdial builds the TCP dialer of every client the relay opens
// (PostgreSQL and Redis), so that a silent peer is noticed within a known
// time: keepalive probes while the link is idle, and TCP_USER_TIMEOUT while
// data waits to be acknowledged.
package netdial

import (
	"net"
	"syscall"
	"time"
)

// TCP holds the socket settings; zero fields keep the system's defaults.
type TCP struct {
	// UserTimeout is how long sent data may stay unacknowledged (and a zero
	// window unanswered) before the kernel closes the connection
	// (TCP_USER_TIMEOUT, Linux only; elsewhere ignored).
	UserTimeout time.Duration
	// KeepaliveIdle is the idle time before the first keepalive probe.
	KeepaliveIdle time.Duration
	// KeepaliveInterval is the time between probes.
	KeepaliveInterval time.Duration
	// KeepaliveCount is the number of unanswered probes that ends the
	// connection.
	KeepaliveCount int
}

// Dialer returns a dialer with these settings and the given connect timeout
// (0: none).
func (t TCP) Dialer(connectTimeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: connectTimeout}
	if t.KeepaliveIdle > 0 || t.KeepaliveInterval > 0 || t.KeepaliveCount > 0 {
		d.KeepAliveConfig = net.KeepAliveConfig{
			Enable:   true,
			Idle:     t.KeepaliveIdle,
			Interval: t.KeepaliveInterval,
			Count:    t.KeepaliveCount,
		}
	}
	if t.UserTimeout > 0 {
		timeout := t.UserTimeout
		d.Control = func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a Unix socket has no TCP options
			}
			var serr error
			if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, timeout) }); err != nil {
				return err
			}
			return serr
		}
	}
	return d
}
