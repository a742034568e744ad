//go:build faults

package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// proxy is a toxiproxy proxy run in this process: 127.0.0.1 on a free port,
// forwarding to upstream.
type proxy struct {
	p *toxiproxy.Proxy
}

// startProxy starts a proxy to upstream (host:port); it is stopped in the
// test's cleanup.
func startProxy(t testing.TB, name, upstream string) *proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	require.NoError(t, server.Collection.Add(p, true), "starting proxy %s", name)
	t.Cleanup(func() { _ = server.Collection.Clear() })
	return &proxy{p: p}
}

// addr is the proxy's listen address, 127.0.0.1:port.
func (x *proxy) addr() string { return x.p.Listen }

// latency delays every byte from upstream to the client by d, so that a
// relay spends most of its time inside a batch.
func (x *proxy) latency(t testing.TB, d time.Duration) {
	t.Helper()
	x.add(t, fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, d.Milliseconds()))
}

// blackhole makes the link a black hole: connections, open and new, stay
// open and every byte is dropped, both ways (the timeout toxic with
// timeout 0).
func (x *proxy) blackhole(t testing.TB) {
	t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		x.add(t, fmt.Sprintf(`{"name":"blackhole_%s","type":"timeout","stream":"%s","attributes":{"timeout":0}}`, stream, stream))
	}
}

func (x *proxy) add(t testing.TB, toxic string) {
	t.Helper()
	_, err := x.p.Toxics.AddToxicJson(strings.NewReader(toxic))
	require.NoError(t, err, "adding toxic %s", toxic)
}

// heal removes every toxic; bytes dropped meanwhile stay lost.
func (x *proxy) heal() { x.p.Toxics.ResetToxics(context.Background()) }
