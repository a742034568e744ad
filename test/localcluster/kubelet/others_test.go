package kubelet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// otherClusters finds a cluster by its kube-proxy's --config path in a
// process table: here one written to a temp dir in /proc's layout (a
// process that looked like a kube-proxy would count as a running cluster
// for the local cluster's own test, run beside this one).
func TestOtherClustersFindsARunningKubeProxy(t *testing.T) {
	proc := t.TempDir()
	state := filepath.Join(proc, "state")
	process := func(pid string, argv ...string) {
		require.NoError(t, os.MkdirAll(filepath.Join(proc, pid), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644))
	}
	process("10", "/envtest/kube-proxy", "--config="+Config{StateDir: state}.proxyConfigPath(), "--v=1")
	process("11", "/envtest/kubelet", "--config="+filepath.Join(proc, "other", "node", "kubelet", "config.yaml"))
	process("12", "/usr/bin/sleep", "--config="+Config{StateDir: "/elsewhere"}.proxyConfigPath())

	require.Equal(t, []string{state}, otherClusters(proc, ""), "any cluster, seen from no state dir")
	require.Equal(t, []string{state}, otherClusters(proc, filepath.Join(proc, "another")), "seen from another cluster's state dir")
	require.Empty(t, otherClusters(proc, state), "its own cluster is not another")
	err := errOtherCluster(otherClusters(proc, ""))
	require.ErrorContains(t, err, "down --state-dir "+state)
}
