package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBacklogBoundFlags(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	o, err := parseFlags(nil, getenv)
	require.NoError(t, err)
	require.Equal(t, 16, o.checks.MaxConcurrentChecks)
	require.Equal(t, 32, o.checks.MaxConcurrentDials)
	require.Equal(t, 10*time.Second, o.checks.Timeout)
	require.Equal(t, 5*time.Second, o.checks.ConnectTimeout)
	require.Equal(t, time.Second, o.checks.FirstConnectTimeout)
	require.Equal(t, 64, o.pools.MaxOpenConns)
	require.Equal(t, int64(1_000_000), o.pools.CountLimit)
	require.False(t, o.pools.AllowFileKeys, "file-reading DSN keys are refused unless allowed")

	o, err = parseFlags([]string{"--backlog-max-concurrent-checks=4", "--backlog-max-open-conns=8",
		"--backlog-max-concurrent-dials=6", "--backlog-connect-timeout=3s", "--backlog-first-connect-timeout=500ms",
		"--backlog-count-limit=500", "--allow-dsn-file-keys"}, getenv)
	require.NoError(t, err)
	require.Equal(t, 4, o.checks.MaxConcurrentChecks)
	require.Equal(t, 6, o.checks.MaxConcurrentDials)
	require.Equal(t, 3*time.Second, o.checks.ConnectTimeout)
	require.Equal(t, 500*time.Millisecond, o.checks.FirstConnectTimeout)
	require.Equal(t, 8, o.pools.MaxOpenConns)
	require.Equal(t, int64(500), o.pools.CountLimit)
	require.True(t, o.pools.AllowFileKeys)

	o, err = parseFlags([]string{"--backlog-max-open-conns=10"}, getenv)
	require.NoError(t, err)
	require.Equal(t, 5, o.checks.MaxConcurrentDials, "half of the connections by default")
	o, err = parseFlags([]string{"--backlog-max-open-conns=1"}, getenv)
	require.NoError(t, err)
	require.Equal(t, 1, o.checks.MaxConcurrentDials)

	for _, args := range [][]string{
		{"--backlog-max-concurrent-checks=0"}, {"--backlog-max-open-conns=0"}, {"--backlog-count-limit=0"},
		{"--backlog-max-concurrent-dials=-1"}, {"--backlog-connect-timeout=0s"}, {"--backlog-first-connect-timeout=0s"},
		{"--backlog-first-connect-timeout=6s"},                               // above the connect timeout
		{"--backlog-max-open-conns=16", "--backlog-max-concurrent-dials=17"}, // dials that could never connect
	} {
		_, err := parseFlags(args, getenv)
		require.Error(t, err, args)
	}
}
