//go:build localcluster

package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
	"github.com/outbox-dev/outbox-operator/test/localcluster/kubelet"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
)

// The real node's test: the kubelet, containerd and runc on this machine run
// the operator's image built from the Dockerfile (make image-offline), under
// the restricted Pod Security profile, and Down leaves nothing behind.

// imageArchive is the operator's image from make image-offline.
func imageArchive(t *testing.T) string {
	t.Helper()
	path := os.Getenv("IMAGE_ARCHIVE")
	if path == "" {
		repo, err := filepath.Abs("../../..")
		require.NoError(t, err)
		path = filepath.Join(repo, "bin", "images", "outbox-operator.oci.tar")
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(t, "the operator's image archive %s is missing: make image-offline builds it", path)
	}
	return path
}

func TestKubeletNodeRunsTheImage(t *testing.T) {
	requireLocalCluster(t)
	archive := imageArchive(t)
	dir := t.TempDir()
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	opts := cluster.Options{
		StateDir: dir, RepoDir: repo, PodCIDR: "10.251.0.0/16", ServiceCIDR: "10.98.0.0/16", Bridge: "obxk0",
		NodeName: "kubelet-node", Node: cluster.NodeKubelet, Images: []string{archive, netcheckArchive(t, repo, dir)},
		Out: testWriter{t},
	}
	if err := kubelet.Preflight(kubelet.Config{AssetsDir: "/nonexistent"}); err != nil && !strings.Contains(err.Error(), "no kubelet") {
		testenv.Missing(t, "%v", err)
	}
	start := time.Now()
	s, err := cluster.Up(ctx, opts)
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				for _, name := range []string{kubelet.Kubelet, kubelet.Containerd, kubelet.KubeProxy} {
					tailLog(t, filepath.Join(s.LogDir(), name+".log"))
				}
			}
			require.NoError(t, cluster.Down(s, false))
			requireNothingLeft(t, s)
		})
	}
	require.NoError(t, err)
	t.Logf("cluster with a kubelet node up in %s", time.Since(start).Round(100*time.Millisecond))
	cs, err := s.Client()
	require.NoError(t, err)

	node, err := cs.CoreV1().Nodes().Get(ctx, s.NodeName, metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://"),
		"runtime %q", node.Status.NodeInfo.ContainerRuntimeVersion)
	require.Contains(t, node.Status.NodeInfo.KubeletVersion, "v1.37")
	require.False(t, node.Spec.Unschedulable)

	ns := "restricted"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Pods are admitted once the namespace's default ServiceAccount exists
	// (the controller manager makes it a moment after the namespace).
	testenv.EventuallyEvery(t, 250*time.Millisecond, time.Minute, "the default ServiceAccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})

	// The operator's image, as its Deployment runs it: user and entrypoint of
	// the image, a read-only root, no capabilities. --help prints and exits 0.
	_, err = cs.CoreV1().Pods(ns).Create(ctx, restrictedPod("relay-help", cluster.ProjectImage+":dev", []string{"/relay", "--help"}, corev1.RestartPolicyNever), metav1.CreateOptions{})
	require.NoError(t, err, "admitted under restricted Pod Security")
	waitPodPhase(t, cs, ns, "relay-help", corev1.PodSucceeded)
	logs, err := cs.CoreV1().Pods(ns).GetLogs("relay-help", &corev1.PodLogOptions{}).Do(ctx).Raw()
	require.NoError(t, err, "kubectl logs, served by the kubelet")
	require.Contains(t, string(logs), "relay", "the relay's help")

	// A pod that stays up: kubectl exec through the kubelet, the process's
	// user on the host and its own network namespace with an address of the
	// pod range.
	_, err = cs.CoreV1().Pods(ns).Create(ctx, restrictedPod("pause", kubelet.PauseImage, nil, corev1.RestartPolicyAlways), metav1.CreateOptions{})
	require.NoError(t, err)
	waitPodPhase(t, cs, ns, "pause", corev1.PodRunning)
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "pause", metav1.GetOptions{})
	require.NoError(t, err)
	_, podNet, _ := net.ParseCIDR(s.PodCIDR)
	require.True(t, podNet.Contains(net.ParseIP(pod.Status.PodIP)), "pod IP %s in %s", pod.Status.PodIP, s.PodCIDR)
	out := execInPod(t, s, cs, ns, "pause", []string{"/pause", "-v"})
	require.Contains(t, out, "pause")

	// Services, through kube-proxy's rules: the kubernetes Service reaches
	// the API server with the pod's own token and CA, as an in-cluster
	// client does (the operator's manager, say).
	api := restrictedPod("api-check", netcheckImage, []string{"/netcheck", "api"}, corev1.RestartPolicyNever)
	api.Spec.AutomountServiceAccountToken = ptr.To(true)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, api, metav1.CreateOptions{})
	require.NoError(t, err)
	requirePodSucceeded(t, cs, ns, "api-check", `"gitVersion": "v1.37`)

	// A ClusterIP Service in front of a pod, reached from another pod.
	web := restrictedPod("web", netcheckImage, []string{"/netcheck", "serve", "8080"}, corev1.RestartPolicyAlways)
	web.Labels = map[string]string{"app": "web"}
	_, err = cs.CoreV1().Pods(ns).Create(ctx, web, metav1.CreateOptions{})
	require.NoError(t, err)
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: web.Labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	waitPodPhase(t, cs, ns, "web", corev1.PodRunning)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, restrictedPod("web-check", netcheckImage,
		[]string{"/netcheck", "get", "http://" + svc.Spec.ClusterIP + "/"}, corev1.RestartPolicyNever), metav1.CreateOptions{})
	require.NoError(t, err)
	requirePodSucceeded(t, cs, ns, "web-check", "netcheck web")

	// Cluster DNS: CoreDNS behind kube-dns answers for the Service's name,
	// and the pod's search path resolves the short one.
	_, err = cs.CoreV1().Pods(ns).Create(ctx, restrictedPod("dns-check", netcheckImage,
		[]string{"/netcheck", "lookup", "web." + ns + ".svc.cluster.local"}, corev1.RestartPolicyNever), metav1.CreateOptions{})
	require.NoError(t, err)
	requirePodSucceeded(t, cs, ns, "dns-check", svc.Spec.ClusterIP)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, restrictedPod("dns-web-check", netcheckImage,
		[]string{"/netcheck", "get", "http://web/"}, corev1.RestartPolicyNever), metav1.CreateOptions{})
	require.NoError(t, err)
	requirePodSucceeded(t, cs, ns, "dns-web-check", "netcheck web")
}

// netcheckImage runs test/localcluster/netcheck, the network probe.
const netcheckImage = "localhost/outbox-local-cluster/netcheck:dev"

// netcheckArchive builds the network probe and packs it into an image
// archive, which Up imports into the node's containerd.
func netcheckArchive(t *testing.T, repo, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "netcheck")
	cmd := exec.Command("go", "build", "-o", bin, "./test/localcluster/netcheck")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build netcheck: %s", out)
	archive := filepath.Join(dir, "netcheck.oci.tar")
	require.NoError(t, kubelet.WriteProgramArchive(archive, netcheckImage, bin, "65532:65532"))
	return archive
}

// requirePodSucceeded waits for the pod to succeed and for its log to hold want.
func requirePodSucceeded(t *testing.T, cs kubernetes.Interface, ns, name, want string) {
	t.Helper()
	testenv.EventuallyEvery(t, 250*time.Millisecond, 3*time.Minute, "pod "+name+" Succeeded", func() error {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed {
			logs, _ := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).Do(context.Background()).Raw()
			t.Fatalf("pod %s failed: %v; log:\n%s", name, podState(p), logs)
		}
		if p.Status.Phase != corev1.PodSucceeded {
			return podState(p)
		}
		return nil
	})
	logs, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).Do(context.Background()).Raw()
	require.NoError(t, err)
	require.Contains(t, string(logs), want, "pod %s's log", name)
}

func restrictedPod(name, image string, command []string, restart corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                restart,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "main", Image: image, Command: command, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

func waitPodPhase(t *testing.T, cs kubernetes.Interface, ns, name string, phase corev1.PodPhase) {
	t.Helper()
	testenv.EventuallyEvery(t, 250*time.Millisecond, 3*time.Minute, "pod "+name+" "+string(phase), func() error {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != phase {
			return podState(p)
		}
		return nil
	})
}

type stateErr string

func (e stateErr) Error() string { return string(e) }

func podState(p *corev1.Pod) error {
	var b strings.Builder
	b.WriteString("phase " + string(p.Status.Phase))
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			b.WriteString("; waiting: " + c.State.Waiting.Reason + " " + c.State.Waiting.Message)
		case c.State.Terminated != nil:
			b.WriteString("; terminated: " + c.State.Terminated.Reason + " " + c.State.Terminated.Message)
		}
	}
	return stateErr(b.String())
}

func execInPod(t *testing.T, s *cluster.State, cs kubernetes.Interface, ns, pod string, command []string) string {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	require.NoError(t, err)
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	require.NoError(t, exec.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}),
		"kubectl exec, through the kubelet; stderr: %s", stderr.String())
	return stdout.String()
}

// requireNothingLeft checks what Down must remove: the node's processes,
// mounts, cgroups, pod network namespaces, bridge and CNI iptables chains.
func requireNothingLeft(t *testing.T, s *cluster.State) {
	t.Helper()
	cfg := s.KubeletConfig()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mounts), " "+s.StateDir, "a mount under the state dir left behind")
	for _, ctl := range []string{"cpu", "memory", "pids", "cpuset"} {
		_, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, cfg.CgroupRoot))
		require.True(t, os.IsNotExist(err), "the cgroup %s/%s left behind", ctl, cfg.CgroupRoot)
	}
	_, err = net.InterfaceByName(s.Bridge)
	require.Error(t, err, "the bridge %s left behind", s.Bridge)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil {
			require.NotContains(t, string(cmdline), s.StateDir, "process %s left behind: %q", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	if b, err := exec.Command("iptables", "-t", "nat", "-S").Output(); err == nil {
		require.NotContains(t, string(b), "CNI-", "CNI iptables chains left behind")
	}
	for _, table := range []string{"nat", "filter", "mangle"} {
		if b, err := exec.Command("iptables", "-t", table, "-S").Output(); err == nil {
			require.NotContains(t, string(b), "KUBE-", "kube-proxy's chains left behind in the %s table", table)
		}
	}
}

func tailLog(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	t.Logf("%s (tail):\n%s", path, strings.Join(lines, "\n"))
}
