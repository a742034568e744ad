package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBacklogBoundFlags(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	o, err := parseFlags(nil, getenv)
	require.NoError(t, err)
	require.Equal(t, 16, o.maxConcurrentChecks)
	require.Equal(t, 64, o.pools.MaxOpenConns)
	require.Equal(t, int64(1_000_000), o.pools.CountLimit)
	require.False(t, o.pools.AllowFileKeys, "file-reading DSN keys are refused unless allowed")

	o, err = parseFlags([]string{"--backlog-max-concurrent-checks=4", "--backlog-max-open-conns=8",
		"--backlog-count-limit=500", "--allow-dsn-file-keys"}, getenv)
	require.NoError(t, err)
	require.Equal(t, 4, o.maxConcurrentChecks)
	require.Equal(t, 8, o.pools.MaxOpenConns)
	require.Equal(t, int64(500), o.pools.CountLimit)
	require.True(t, o.pools.AllowFileKeys)

	for _, arg := range []string{"--backlog-max-concurrent-checks=0", "--backlog-max-open-conns=0", "--backlog-count-limit=0"} {
		_, err := parseFlags([]string{arg}, getenv)
		require.Error(t, err, arg)
	}
}
