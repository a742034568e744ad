package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// proxyConfigSuffix ends kube-proxy's --config path under a state dir.
var proxyConfigSuffix = string(filepath.Separator) + filepath.Join("node", "kube-proxy", "config.yaml")

// OtherClusters lists the state dirs of the local clusters whose kube-proxy
// runs on this machine, other than the one under stateDir (empty: every
// one). kube-proxy's rules are host-wide, and so is the cleanup of them at
// down: two clusters on one machine would rewrite and remove each other's
// Service rules, so only one may run at a time.
func OtherClusters(stateDir string) []string { return otherClusters("/proc", stateDir) }

// otherClusters is OtherClusters on the process table at proc.
func otherClusters(proc, stateDir string) []string {
	var dirs []string
	procs, _ := os.ReadDir(proc)
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join(proc, p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != KubeProxy {
			continue
		}
		for _, a := range args[1:] {
			path, ok := strings.CutPrefix(a, "--config=")
			if !ok || !strings.HasSuffix(path, proxyConfigSuffix) {
				continue
			}
			dir := strings.TrimSuffix(path, proxyConfigSuffix)
			if stateDir == "" || filepath.Clean(dir) != filepath.Clean(stateDir) {
				dirs = append(dirs, dir)
			}
		}
	}
	return dirs
}

// errOtherCluster names the running clusters and how to stop them.
func errOtherCluster(dirs []string) error {
	return fmt.Errorf("another local cluster runs on this machine (state dir %s); kube-proxy's rules are host-wide, "+
		"so one runs at a time: stop it first with go run ./hack/localcluster down --state-dir %s",
		strings.Join(dirs, ", "), dirs[0])
}
