// Command localcluster runs the project's local Kubernetes cluster, which needs
// no Docker: a real control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) and one real node (a kubelet on
// containerd and runc, kube-proxy, CoreDNS) that runs the images built from
// the Dockerfile. docs/local-cluster.md tells how it is built and what still
// differs from kind.
//
//	go run ./hack/localcluster up --image bin/images/outbox-operator.oci.tar  # start (or reuse) the cluster; prints KUBECONFIG=<path>
//	go run ./hack/localcluster status      # which processes run
//	go run ./hack/localcluster kubeconfig  # the admin kubeconfig's path
//	go run ./hack/localcluster down        # stop everything; remove its rules, mounts, interfaces and files
//
// The state dir is $LOCAL_CLUSTER_DIR, or /var/lib/outbox-local-cluster.
// `demo-services` starts the demo's PostgreSQL and Redis on the host
// (hack/demo.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "status":
		err = status(os.Args[2:])
	case "kubeconfig":
		err = kubeconfig(os.Args[2:])
	case demoServices:
		err = demoServicesCmd(os.Args[2:])
	case "demo-services-run":
		err = demoServicesRun(os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: localcluster up|down|status|kubeconfig [--state-dir DIR]

  up          start the cluster, or reuse the one running; print KUBECONFIG=<path>
              (--image ARCHIVE imports an OCI archive of make image-offline; repeatable)
  down        stop the pods, then every process of the cluster by pid; remove its
              iptables rules, cgroups, mounts, bridge and state dir
  status      list the cluster's processes and whether they run
  kubeconfig  print the admin kubeconfig's path

The state dir is $LOCAL_CLUSTER_DIR, or `+cluster.DefaultStateDir+`.`)
}

func stateFlag(fs *flag.FlagSet) *string {
	return fs.String("state-dir", cluster.StateDirFromEnv(), "the cluster's state dir ($"+cluster.EnvStateDir+")")
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := stateFlag(fs)
	repo := fs.String("repo", ".", "the checkout to build the binaries from")
	assets := fs.String("assets", "", "dir of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, "+
		"kubelet, kube-proxy, coredns ($"+cluster.EnvAssets+"; default: hack/setup-envtest.sh --with-node)")
	podCIDR := fs.String("pod-cidr", "", "pod address range (default 10.244.0.0/16)")
	bridge := fs.String("bridge", "", "name of the pod bridge (default obx0)")
	var images imageList
	fs.Var(&images, "image", "an OCI archive (make image-offline) for the node to import; repeatable")
	_ = fs.Parse(args)
	repoAbs, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	s, err := cluster.Up(ctx, cluster.Options{
		StateDir: *dir, RepoDir: repoAbs, AssetsDir: *assets, PodCIDR: *podCIDR, Bridge: *bridge, Out: os.Stderr,
		Images: images,
	})
	if err != nil {
		if s != nil {
			return fmt.Errorf("%w\nlogs: %s; stop what started with: go run ./hack/localcluster down --state-dir %s", err, s.LogDir(), *dir)
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "The local cluster is up (%s): API server %s, node %s.\n",
		time.Since(start).Round(100*time.Millisecond), s.Server(), s.NodeName)
	fmt.Printf("KUBECONFIG=%s\n", s.Kubeconfig())
	return nil
}

// imageList is a repeatable flag.
type imageList []string

func (l *imageList) String() string     { return fmt.Sprint([]string(*l)) }
func (l *imageList) Set(v string) error { *l = append(*l, v); return nil }

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := stateFlag(fs)
	keep := fs.Bool("keep-state", false, "keep the state dir (certificates, etcd data, logs)")
	_ = fs.Parse(args)
	s, err := cluster.Load(*dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "No local cluster in %s.\n", *dir)
		return nil
	}
	if err != nil {
		return err
	}
	if err := cluster.Down(s, *keep); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "The local cluster in %s is down.\n", *dir)
	return nil
}

func status(args []string) error {
	fs := flag.NewFlagSet("status", flag.ExitOnError)
	dir := stateFlag(fs)
	_ = fs.Parse(args)
	s, err := cluster.Load(*dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Printf("No local cluster in %s.\n", *dir)
		os.Exit(3)
	}
	if err != nil {
		return err
	}
	st := cluster.Status(s)
	names := make([]string, 0, len(st))
	for n := range st {
		names = append(names, n)
	}
	sort.Strings(names)
	all := true
	for _, n := range names {
		state := "running"
		if !st[n] {
			state, all = "stopped", false
		}
		fmt.Printf("%-24s %s\n", n, state)
	}
	fmt.Printf("KUBECONFIG=%s\n", s.Kubeconfig())
	if !all {
		os.Exit(3)
	}
	return nil
}

func kubeconfig(args []string) error {
	fs := flag.NewFlagSet("kubeconfig", flag.ExitOnError)
	dir := stateFlag(fs)
	_ = fs.Parse(args)
	s, err := cluster.Load(*dir)
	if err != nil {
		return err
	}
	fmt.Println(s.Kubeconfig())
	return nil
}
