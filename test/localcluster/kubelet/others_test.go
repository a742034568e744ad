package kubelet

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// OtherClusters finds a cluster by its kube-proxy's --config path. The
// process here is a stand-in, a shell whose argv reads as a kube-proxy's:
// what OtherClusters reads is the command line, which a real kube-proxy has
// the same.
func TestOtherClustersFindsARunningKubeProxy(t *testing.T) {
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	c := Config{StateDir: state}
	// sh -c SCRIPT NAME: the flag is the script's $0, and two commands keep
	// the shell from exec'ing sleep in its place.
	cmd := &exec.Cmd{Path: sh, Args: []string{filepath.Join(dir, KubeProxy), "-c", "sleep 60; :", "--config=" + c.proxyConfigPath()}}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	require.Contains(t, OtherClusters(""), state, "any cluster, seen from no state dir")
	require.Contains(t, OtherClusters(filepath.Join(dir, "another")), state, "seen from another cluster's state dir")
	require.NotContains(t, OtherClusters(state), state, "its own cluster is not another")
	err = errOtherCluster(OtherClusters(filepath.Join(dir, "another")))
	require.ErrorContains(t, err, "down --state-dir ")
	require.ErrorContains(t, err, state)
}
