package kubelet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/supervise"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// packages names the Debian package of each program the node needs.
var packages = []struct{ path, pkg string }{
	{"containerd", pkgContainerd},
	{"containerd-shim-runc-v2", pkgContainerd},
	{"ctr", pkgContainerd},
	{"runc", "runc"},
	{iptables, iptables},
	{filepath.Join(CNIBinDir, "bridge"), pkgCNI},
	{filepath.Join(CNIBinDir, "host-local"), pkgCNI},
	{filepath.Join(CNIBinDir, "loopback"), pkgCNI},
	{filepath.Join(CNIBinDir, "portmap"), pkgCNI},
}

// cgroupControllers are the cgroup v1 controllers the kubelet needs.
var cgroupControllers = []string{"cpu", "cpuacct", "cpuset", "memory", "pids"}

// cgroupHierarchies are the cgroup v1 hierarchies mounted under
// /sys/fs/cgroup (the kubelet's cgroupfs driver makes its cgroups in each);
// the cgroup v2 one of a hybrid host ("unified") is left alone.
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.Name() == "unified" {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", e.Name(), "cgroup.procs")); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// Preflight says what is missing for the node to run here, with the command
// that installs it: programs, the kubelet binary, cgroup controllers, the
// overlay file system; and whether another local cluster runs here.
func Preflight(c Config) error {
	var missing []string
	for _, p := range packages {
		if _, err := exec.LookPath(p.path); err != nil && !slices.Contains(missing, p.pkg) {
			missing = append(missing, p.pkg)
		}
	}
	var errs []error
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("the real node needs %s: apt-get install -y %s", strings.Join(missing, ", "), strings.Join(missing, " ")))
	}
	for _, bin := range []string{Kubelet, KubeProxy, "coredns"} {
		if _, err := os.Stat(filepath.Join(c.AssetsDir, bin)); err != nil {
			errs = append(errs, fmt.Errorf("no %s in %s: hack/setup-envtest.sh --with-node builds it", bin, c.AssetsDir))
		}
	}
	for _, ctl := range cgroupControllers {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, "cgroup.procs")); err != nil {
			errs = append(errs, fmt.Errorf("the cgroup v1 controller %s is not mounted at /sys/fs/cgroup/%s: "+
				"the kubelet needs cpu, cpuacct, cpuset, memory and pids", ctl, ctl))
		}
	}
	if b, err := os.ReadFile("/proc/filesystems"); err == nil && !strings.Contains(string(b), "overlay") {
		errs = append(errs, errors.New("the kernel has no overlay file system (containerd's snapshotter): modprobe overlay"))
	}
	if others := OtherClusters(c.StateDir); len(others) > 0 {
		errs = append(errs, errOtherCluster(others))
	}
	return errors.Join(errs...)
}

// Start writes the node's configuration, starts containerd and the kubelet
// unless they run, and imports the pause image and every archive of images.
// Waiting for the Node to be Ready is the caller's (it has the client), and so
// is Preflight, which cluster.Up runs before the control plane starts.
func Start(ctx context.Context, c Config, images []string) (started []string, err error) {
	if err := writeConfigs(c); err != nil {
		return nil, err
	}
	if err := ensureCgroupRoot(c.cgroupRoot()); err != nil {
		return nil, err
	}
	if ok, err := startContainerd(ctx, c); err != nil {
		return started, err
	} else if ok {
		started = append(started, Containerd)
	}
	pause := filepath.Join(c.Dir(), "images", "pause.oci.tar")
	if err := writePauseArchive(c.PauseBinary, pause); err != nil {
		return started, err
	}
	coreDNS := filepath.Join(c.Dir(), "images", "coredns.oci.tar")
	if err := writeCoreDNSArchive(c.coreDNSBinary(), coreDNS); err != nil {
		return started, err
	}
	for _, archive := range append([]string{pause, coreDNS}, images...) {
		if err := ImportImage(ctx, c, archive); err != nil {
			return started, err
		}
	}
	if _, alive := supervise.AliveFromFile(filepath.Join(c.PidDir, Kubelet+".pid")); !alive {
		if _, err := supervise.Start(supervise.Spec{Name: Kubelet, Path: filepath.Join(c.AssetsDir, "kubelet"),
			Args: c.kubeletArgs()}, c.PidDir, c.LogDir); err != nil {
			return started, err
		}
		started = append(started, Kubelet)
	}
	if _, alive := supervise.AliveFromFile(filepath.Join(c.PidDir, KubeProxy+".pid")); !alive {
		if _, err := supervise.Start(supervise.Spec{Name: KubeProxy, Path: filepath.Join(c.AssetsDir, KubeProxy),
			Args: c.proxyArgs()}, c.PidDir, c.LogDir); err != nil {
			return started, err
		}
		started = append(started, KubeProxy)
	}
	return started, nil
}

// startContainerd starts containerd unless it runs (started reports that it
// did) and waits until it answers.
func startContainerd(ctx context.Context, c Config) (started bool, err error) {
	if _, alive := supervise.AliveFromFile(filepath.Join(c.PidDir, Containerd+".pid")); !alive {
		if _, err := supervise.Start(supervise.Spec{Name: Containerd, Path: mustLookPath(pkgContainerd),
			Args: []string{"--config", c.containerdConfigPath()}}, c.PidDir, c.LogDir); err != nil {
			return false, err
		}
		started = true
	}
	if err := waitContainerd(ctx, c); err != nil {
		return started, fmt.Errorf("containerd did not answer: %w (log: %s)", err, filepath.Join(c.LogDir, Containerd+".log"))
	}
	return started, nil
}

// KubeletAlive reports whether the kubelet's process runs.
func KubeletAlive(c Config) bool {
	_, alive := supervise.AliveFromFile(filepath.Join(c.PidDir, Kubelet+".pid"))
	return alive
}

// Running reports, per process of the node, whether it is alive.
func Running(c Config) map[string]bool {
	m := map[string]bool{}
	for _, name := range []string{Containerd, Kubelet, KubeProxy} {
		_, m[name] = supervise.AliveFromFile(filepath.Join(c.PidDir, name+".pid"))
	}
	return m
}

func mustLookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}

func writeConfigs(c Config) error {
	cni, err := c.cniConfig()
	if err != nil {
		return err
	}
	kubelet, err := c.kubeletConfig()
	if err != nil {
		return err
	}
	proxy, err := c.proxyConfig()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		c.containerdConfigPath():                            []byte(c.containerdConfig()),
		filepath.Join(c.cniConfDir(), "10-outbox.conflist"): cni,
		c.kubeletConfigPath():                               kubelet,
		c.proxyConfigPath():                                 proxy,
		// Pods of dnsPolicy Default get this; ClusterFirst pods get ClusterDNS.
		c.resolvConfPath(): []byte("# The local cluster's node: no upstream resolver (no traffic leaves the machine).\noptions ndots:1\n"),
	}
	for path, b := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ensureCgroupRoot creates the kubelet's cgroup root in every v1 controller
// (the kubelet refuses a root that does not exist); a new cpuset cgroup starts
// with no CPUs and memory nodes, so it gets its parent's.
func ensureCgroupRoot(root string) error {
	for _, ctl := range cgroupHierarchies() {
		dir := filepath.Join("/sys/fs/cgroup", ctl, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating the cgroup %s: %w", dir, err)
		}
		if ctl != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, _ := os.ReadFile(filepath.Join(dir, f))
			if strings.TrimSpace(string(cur)) != "" {
				continue
			}
			parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
				return fmt.Errorf("setting %s/%s: %w", dir, f, err)
			}
		}
	}
	return nil
}

func waitContainerd(ctx context.Context, c Config) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		if _, alive := supervise.AliveFromFile(filepath.Join(c.PidDir, Containerd+".pid")); !alive {
			return errors.New("the process exited")
		}
		b, err := exec.CommandContext(ctx, "ctr", "--address", c.ContainerdSocket(), "version").CombinedOutput()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(b)))
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Stop removes every pod sandbox through the CRI (the CNI plugins release the
// pods' addresses and network namespaces, containerd unmounts their root file
// systems), stops the kubelet first so that it starts nothing new, then
// containerd, kills any shim or container process left in the node's cgroups,
// unmounts what is still mounted under the state dir and removes the cgroups.
// kube-proxy goes last of the node's processes, then removes its rules
// (kube-proxy --cleanup): no Service rule outlives the cluster.
func Stop(c Config) error {
	errs := []error{supervise.Stop(filepath.Join(c.PidDir, Kubelet+".pid"), 30*time.Second)}
	// The sandboxes go through the CRI, so that the CNI plugins delete the
	// pods' network namespaces and veths: a containerd that died (its
	// config still there) is started again for that.
	if _, err := os.Stat(c.containerdConfigPath()); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := startContainerd(ctx, c); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, removeSandboxes(c))
		}
		cancel()
	}
	errs = append(errs,
		supervise.Stop(filepath.Join(c.PidDir, Containerd+".pid"), 20*time.Second),
		supervise.Stop(filepath.Join(c.PidDir, KubeProxy+".pid"), 20*time.Second),
		cleanupProxyRules(c),
		killShims(c),
		killCgroup(c.cgroupRoot()),
		unmountUnder(c.StateDir),
		removeCgroupRoot(c.cgroupRoot()),
		removeIPTablesChains(),
	)
	return errors.Join(errs...)
}

// cleanupProxyRules runs kube-proxy --cleanup, which deletes every chain and
// rule kube-proxy made (KUBE-SERVICES, KUBE-SVC-*, ...), when there are any.
func cleanupProxyRules(c Config) error {
	bin := filepath.Join(c.AssetsDir, KubeProxy)
	if _, err := os.Stat(bin); err != nil {
		return nil //nolint:nilerr // never started: no rules
	}
	b, err := exec.Command(iptables, "-t", "nat", "-S").Output()
	if err != nil || !strings.Contains(string(b), "KUBE-") {
		return nil //nolint:nilerr // no iptables, or nothing of kube-proxy's
	}
	if out, err := exec.Command(bin, "--cleanup", "--v=1").CombinedOutput(); err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w\n%s", err, out)
	}
	return nil
}

// removeSandboxes stops and removes every pod sandbox containerd's CRI holds.
func removeSandboxes(c Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+c.ContainerdSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	rt := criv1.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range list.GetItems() {
		if _, err := rt.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("stopping sandbox %s: %w", sb.GetMetadata().GetName(), err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox %s: %w", sb.GetMetadata().GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// killShims kills the runc shims of this node's containerd (they outlive
// containerd by design); they name its socket in their arguments.
func killShims(c Config) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" || !slices.Contains(args, c.ContainerdSocket()) {
			continue
		}
		errs = append(errs, supervise.StopPid(pid, "", 5*time.Second))
	}
	return errors.Join(errs...)
}

// killCgroup kills every process left in the node's cgroups.
func killCgroup(root string) error {
	var errs []error
	for _, ctl := range cgroupHierarchies() {
		base := filepath.Join("/sys/fs/cgroup", ctl, root)
		_ = filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil //nolint:nilerr // a cgroup removed while walking
			}
			b, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
						errs = append(errs, fmt.Errorf("killing %d of %s: %w", pid, path, err))
					}
				}
			}
			return nil
		})
	}
	return errors.Join(errs...)
}

// removeCgroupRoot removes the node's cgroups, deepest first; a cgroup holds
// no files of its own, so rmdir is enough once it has no processes.
func removeCgroupRoot(root string) error {
	var errs []error
	for _, ctl := range cgroupHierarchies() {
		base := filepath.Join("/sys/fs/cgroup", ctl, root)
		var dirs []string
		_ = filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for range 50 { // a killed process leaves its cgroup a moment later
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing the cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount point under dir, deepest first: the
// kubelet's volumes (tmpfs for Secrets and tokens) and containerd's overlay
// root file systems, when a pod outlived the CRI's cleanup.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, p := range slices.Compact(points) {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// removeIPTablesChains removes the chains the CNI portmap plugin creates
// (CNI-HOSTPORT-*, CNI-DN-*) from the nat table, and the chains kube-proxy
// --cleanup empties but keeps (KUBE-FIREWALL in the filter table), with the
// jumps into them from the built-in chains. A KUBE- chain that still has
// rules is not this cluster's leftover and is kept.
func removeIPTablesChains() error {
	return errors.Join(
		removeChains("nat", func(chain string, _ int) bool { return strings.HasPrefix(chain, "CNI-") }),
		removeChains("filter", func(chain string, rules int) bool { return strings.HasPrefix(chain, "KUBE-") && rules == 0 }),
	)
}

// removeChains deletes, in one iptables table, the chains that remove
// selects (given each chain's name and number of rules), with every rule
// of the other chains that jumps into them.
func removeChains(table string, remove func(chain string, rules int) bool) error {
	b, err := exec.Command(iptables, "-t", table, "-S").Output()
	if err != nil {
		return nil //nolint:nilerr // no iptables: nothing was added
	}
	var chains []string
	rules := map[string]int{}
	var lines [][]string
	for _, line := range strings.Split(string(b), "\n") {
		f := splitRule(line)
		switch {
		case len(f) >= 2 && f[0] == "-N":
			chains = append(chains, f[1])
		case len(f) >= 2 && f[0] == "-A":
			rules[f[1]]++
			lines = append(lines, f)
		}
	}
	chains = slices.DeleteFunc(chains, func(ch string) bool { return !remove(ch, rules[ch]) })
	var errs []error
	run := func(args ...string) {
		if out, err := exec.Command(iptables, append([]string{"-t", table}, args...)...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables -t %s %s: %w: %s", table, strings.Join(args, " "), err, out))
		}
	}
	for _, f := range lines { // the jumps into the chains, from the others
		if !slices.Contains(chains, f[1]) && slices.ContainsFunc(f[2:], func(w string) bool { return slices.Contains(chains, w) }) {
			run(append([]string{"-D"}, f[1:]...)...)
		}
	}
	for _, ch := range chains { // then the chains: emptied, then deleted
		run("-F", ch)
	}
	for _, ch := range chains {
		run("-X", ch)
	}
	return errors.Join(errs...)
}

// splitRule splits a line of `iptables -S` into its words; a double-quoted
// word (a comment) keeps its spaces and loses its quotes.
func splitRule(line string) []string {
	var words []string
	var cur strings.Builder
	quoted, escaped, inWord := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quoted:
			escaped = true
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
