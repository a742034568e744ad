//go:build localcluster

package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
	"github.com/outbox-dev/outbox-operator/test/localcluster/kubelet"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
)

// The local cluster's test: one cluster in a temp dir, on a bridge and
// ranges of its own, whose node (a kubelet on containerd and runc) runs the
// images built from the Dockerfile (make image-offline); then Down, which
// must leave nothing behind. The file is built only with -tags localcluster
// (make test-local-cluster), so that `go test ./...` does not start clusters.

func TestMain(m *testing.M) { testenv.Main(m) }

// The two images of this repo (the Dockerfile's targets): the operator's and
// the sample's.
const (
	image       = cluster.ProjectImage + ":dev"
	sampleImage = cluster.SampleImage + ":dev"
)

// requireLocalCluster skips (fails in CI) unless the machine can run a
// cluster: root, and the node's packages (kubelet.Preflight names them with
// their apt-get line; the kubelet binary itself is built by Up).
func requireLocalCluster(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "the local cluster needs root (containerd, the kubelet, a bridge, iptables rules)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "`ip` is missing: apt-get install -y iproute2")
	}
	if err := kubelet.Preflight(kubelet.Config{AssetsDir: "/nonexistent"}); err != nil {
		var rest []string
		for _, line := range strings.Split(err.Error(), "\n") {
			if !strings.HasPrefix(line, "no ") { // the node's binaries: Up builds them
				rest = append(rest, line)
			}
		}
		if len(rest) > 0 {
			testenv.Missing(t, "%s (hack/install-test-deps.sh --node)", strings.Join(rest, "; "))
		}
	}
}

// imageArchives are the operator's and the sample's images from make
// image-offline.
func imageArchives(t *testing.T, repo string) []string {
	t.Helper()
	paths := make([]string, 0, 2)
	for _, a := range []struct{ env, file string }{
		{"IMAGE_ARCHIVE", "outbox-operator.oci.tar"}, {"SAMPLE_IMAGE_ARCHIVE", "outbox-operator-sample.oci.tar"},
	} {
		path := os.Getenv(a.env)
		if path == "" {
			path = filepath.Join(repo, "bin", "images", a.file)
		}
		if _, err := os.Stat(path); err != nil {
			testenv.Missing(t, "the image archive %s is missing: make image-offline builds it", path)
		}
		paths = append(paths, path)
	}
	return paths
}

// startCluster brings a cluster up in a temp dir on its own bridge and
// ranges with both images and the network probe's, and brings it down at
// cleanup, checking that nothing is left.
func startCluster(t *testing.T) (*cluster.State, kubernetes.Interface) {
	t.Helper()
	requireLocalCluster(t)
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	images := imageArchives(t, repo)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	s, err := cluster.Up(ctx, cluster.Options{
		StateDir: dir, RepoDir: repo, PodCIDR: "10.250.0.0/16", ServiceCIDR: "10.97.0.0/16", Bridge: "obxt0",
		NodeName: "test-node", Images: append(images, netcheckArchive(t, repo, dir)), Out: testWriter{t},
	})
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
	t.Logf("cluster up in %s", time.Since(start).Round(100*time.Millisecond))
	cs, err := s.Client()
	require.NoError(t, err)
	return s, cs
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// eventually polls cond every 250ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.EventuallyEvery(t, 250*time.Millisecond, timeout, what, func() error {
		if ok, state := cond(); !ok {
			return fmt.Errorf("last: %s", state)
		}
		return nil
	})
}

// createNamespace makes a namespace (enforcing the restricted Pod Security
// Standard when restricted) and waits for its default ServiceAccount, which
// pods need to be admitted (the controller manager makes it a moment later).
func createNamespace(t *testing.T, cs kubernetes.Interface, name string, restricted bool) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if restricted {
		ns.Labels = map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
		}
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	require.NoError(t, err)
	testenv.EventuallyEvery(t, 250*time.Millisecond, time.Minute, "the default ServiceAccount of "+name, func() error {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func TestLocalCluster(t *testing.T) {
	s, cs := startCluster(t)
	t.Run("the node", func(t *testing.T) { testNode(t, s, cs) })
	t.Run("the image under restricted Pod Security", func(t *testing.T) { testRestrictedImage(t, s, cs) })
	t.Run("Services and DNS", func(t *testing.T) { testServices(t, s, cs) })
	t.Run("Deployments and Jobs", func(t *testing.T) { testWorkloads(t, s, cs) })
	t.Run("a stopped cluster starts again", func(t *testing.T) { testRestart(t, s) })
}

// testRestart: a cluster stopped with its state kept (a reboot, say) starts
// again from it, and a port of it that another program took meanwhile is
// named before anything starts.
func testRestart(t *testing.T, s *cluster.State) {
	require.NoError(t, cluster.Down(s, true))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	again := cluster.Options{StateDir: s.StateDir, RepoDir: s.RepoDir, SkipBuild: true, Out: testWriter{t}}

	taken, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.APIServerPort))
	require.NoError(t, err)
	_, err = cluster.Up(ctx, again)
	require.ErrorContains(t, err, fmt.Sprintf("port %d of kube-apiserver is taken by another program", s.APIServerPort))
	require.NoError(t, taken.Close())

	_, err = cluster.Up(ctx, again)
	require.NoError(t, err, "up of the stopped cluster")
	cs, err := s.Client()
	require.NoError(t, err)
	pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items, "CoreDNS after the restart")
}

// testNode: the Node is registered, Ready and schedulable like any other,
// with a containerd runtime and the kubelet of this Kubernetes version.
func testNode(t *testing.T, s *cluster.State, cs kubernetes.Interface) {
	node, err := cs.CoreV1().Nodes().Get(context.Background(), s.NodeName, metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://"),
		"runtime %q", node.Status.NodeInfo.ContainerRuntimeVersion)
	require.Contains(t, node.Status.NodeInfo.KubeletVersion, "v1.37")
	require.False(t, node.Spec.Unschedulable)
}

// testRestrictedImage: the operator's image as its Deployment runs it, and a
// pod that stays up for kubectl exec, in a namespace that enforces the
// restricted profile.
func testRestrictedImage(t *testing.T, s *cluster.State, cs kubernetes.Interface) {
	ctx := context.Background()
	ns := "restricted"
	createNamespace(t, cs, ns, true)

	// User and entrypoint of the image, a read-only root, no capabilities.
	// --help prints and exits 0.
	help := restrictedPod("relay-help", image, []string{"/relay", "--help"}, corev1.RestartPolicyNever)
	_, err := cs.CoreV1().Pods(ns).Create(ctx, help, metav1.CreateOptions{})
	require.NoError(t, err, "admitted under restricted Pod Security")
	waitPodPhase(t, cs, ns, "relay-help", corev1.PodSucceeded)
	logs, err := cs.CoreV1().Pods(ns).GetLogs("relay-help", &corev1.PodLogOptions{}).Do(ctx).Raw()
	require.NoError(t, err, "kubectl logs, served by the kubelet")
	require.Contains(t, string(logs), "relay", "the relay's help")

	// kubectl exec through the kubelet, in a pod with its own network
	// namespace and an address of the pod range.
	pause := restrictedPod("pause", kubelet.PauseImage, nil, corev1.RestartPolicyAlways)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, pause, metav1.CreateOptions{})
	require.NoError(t, err)
	waitPodPhase(t, cs, ns, "pause", corev1.PodRunning)
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "pause", metav1.GetOptions{})
	require.NoError(t, err)
	_, podNet, _ := net.ParseCIDR(s.PodCIDR)
	require.True(t, podNet.Contains(net.ParseIP(pod.Status.PodIP)), "pod IP %s in %s", pod.Status.PodIP, s.PodCIDR)
	out := execInPod(t, s, cs, ns, "pause", []string{"/pause", "-v"})
	require.Contains(t, out, "pause")
}

// testServices: kube-proxy's rules and CoreDNS, from pods under restricted
// Pod Security.
func testServices(t *testing.T, s *cluster.State, cs kubernetes.Interface) {
	ctx := context.Background()
	ns := "services"
	createNamespace(t, cs, ns, true)

	// The kubernetes Service reaches the API server with the pod's own token
	// and CA, as an in-cluster client does (the operator's manager, say).
	api := restrictedPod("api-check", netcheckImage, []string{"/netcheck", "api"}, corev1.RestartPolicyNever)
	api.Spec.AutomountServiceAccountToken = ptr.To(true)
	_, err := cs.CoreV1().Pods(ns).Create(ctx, api, metav1.CreateOptions{})
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

	// kubectl port-forward and attach, both served by the kubelet: a request
	// through the forwarded port shows in the attached output.
	// attach streams only what is written after it connects, so the
	// request is repeated until its line shows.
	attached := attachToPod(t, s, cs, ns, "web")
	port := portForward(t, s, cs, ns, "web", 8080)
	eventually(t, 30*time.Second, "a request through port-forward in the attached output", func() (bool, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/through-port-forward", port))
		if err != nil {
			return false, "GET through kubectl port-forward: " + err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.Contains(string(body), "netcheck web") {
			return false, "GET through kubectl port-forward answered " + string(body)
		}
		out := attached.String()
		return strings.Contains(out, "served GET /through-port-forward"), "attached output: " + out
	})

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

// testWorkloads: Jobs and a Deployment of the sample's image against
// PostgreSQL on the host, behind a Service without selector whose
// EndpointSlice points at the gateway (the host's side of the pod network).
func testWorkloads(t *testing.T, s *cluster.State, cs kubernetes.Interface) {
	ctx := context.Background()
	ns := "workloads"
	createNamespace(t, cs, ns, false)

	// Pods log in from the pod range with a password; loopback is trusted.
	pg := testenv.StartPostgres(t, testenv.WithPostgresListen(s.Gateway, s.PodCIDR))
	const password = "local-cluster-test"
	conn, err := pgx.Connect(ctx, pg.DSN())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+password+"'")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	pgURL, err := url.Parse(pg.DSN())
	require.NoError(t, err)
	pgPort, err := strconv.Atoi(pgURL.Port())
	require.NoError(t, err)
	_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "postgres", Port: 5432}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "db-host", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("postgres"), Port: new(int32(pgPort))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{s.Gateway}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	dsn := *pgURL
	dsn.Host = "db:5432" // through the Service, by its short name
	dsn.User = url.UserPassword("postgres", password)
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"dsn": dsn.String()},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	dbEnv := []corev1.EnvVar{{Name: "DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "dsn"}}}}

	t.Log("A Job of the sample's image runs to completion")
	migrate := job("migrate", sampleImage, corev1.RestartPolicyOnFailure, []string{"/orders-api", "migrate", "--timeout=1m"}, dbEnv)
	_, err = cs.BatchV1().Jobs(ns).Create(ctx, migrate, metav1.CreateOptions{})
	require.NoError(t, err)
	waitJob(t, cs, ns, "migrate", batchv1.JobComplete)
	pods := podsOf(t, cs, ns, "job-name=migrate")
	require.Equal(t, corev1.PodSucceeded, pods[0].Status.Phase)
	logs, err := cs.CoreV1().Pods(ns).GetLogs(pods[0].Name, &corev1.PodLogOptions{}).Do(ctx).Raw()
	require.NoError(t, err, "kubectl logs goes through the kubelet")
	t.Logf("migrate logs: %s", logs)

	t.Log("A failing Job fails, with the exit code in the container status")
	fails := job("fails", image, corev1.RestartPolicyNever, []string{"/relay", "no-such-command"}, nil)
	_, err = cs.BatchV1().Jobs(ns).Create(ctx, fails, metav1.CreateOptions{})
	require.NoError(t, err)
	waitJob(t, cs, ns, "fails", batchv1.JobFailed)
	failed := podsOf(t, cs, ns, "job-name=fails")[0]
	require.Equal(t, corev1.PodFailed, failed.Status.Phase)
	require.NotNil(t, failed.Status.ContainerStatuses[0].State.Terminated)
	require.NotZero(t, failed.Status.ContainerStatuses[0].State.Terminated.ExitCode)

	t.Log("A pod of an image the node does not hold, and cannot pull, waits with the kubelet's reason")
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "postgres"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres:16"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(t, 2*time.Minute, "the postgres:16 pod to wait for its image", func() (bool, string) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "postgres", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				return true, ""
			}
		}
		return false, podState(p).Error()
	})

	t.Log("A Deployment's pod runs and gets ready (readiness probe on a named port, through the kubelet)")
	dep := deployment("orders-api", dbEnv)
	_, err = cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{})
	require.NoError(t, err)
	first := waitReadyPod(t, cs, ns, "app=orders-api", "")

	t.Log("The pod answers on its own address; the order reaches PostgreSQL through the Service")
	resp, err := http.Post(fmt.Sprintf("http://%s:8080/orders", first.Status.PodIP), "application/json",
		strings.NewReader(`{"customer_email": "t@example.com", "amount": "1.00"}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)

	t.Log("A deleted pod is stopped and replaced by its ReplicaSet")
	require.NoError(t, cs.CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}))
	second := waitReadyPod(t, cs, ns, "app=orders-api", first.Name)
	require.NotEqual(t, first.Name, second.Name)
	eventually(t, time.Minute, "the deleted pod to be gone", func() (bool, string) {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	t.Log("Deleting the Deployment removes its ReplicaSet and pods through the garbage collector")
	background := metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationBackground)}
	require.NoError(t, cs.AppsV1().Deployments(ns).Delete(ctx, "orders-api", background))
	eventually(t, 2*time.Minute, "the ReplicaSet and pods to be collected", func() (bool, string) {
		rs, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orders-api"})
		if err != nil {
			return false, err.Error()
		}
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orders-api"})
		if err != nil {
			return false, err.Error()
		}
		return len(rs.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d ReplicaSets, %d pods", len(rs.Items), len(pods.Items))
	})
}

func job(name, image string, policy corev1.RestartPolicy, command []string, env []corev1.EnvVar) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: policy,
				Containers:    []corev1.Container{{Name: name, Image: image, Command: command, Env: env}},
			}},
		},
	}
}

func deployment(name string, env []corev1.EnvVar) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64(5)),
					SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65532))},
					Containers: []corev1.Container{{
						Name: name, Image: sampleImage,
						Command: []string{"/orders-api"}, Args: []string{"--bind-address=:$(PORT)"},
						Env:   append([]corev1.EnvVar{{Name: "PORT", Value: "8080"}}, env...),
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
							HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}}},
						LivenessProbe: &corev1.Probe{PeriodSeconds: 5, ProbeHandler: corev1.ProbeHandler{
							TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}},
					}},
				},
			},
		},
	}
}

func waitJob(t *testing.T, cs kubernetes.Interface, ns, name string, cond batchv1.JobConditionType) {
	t.Helper()
	eventually(t, 3*time.Minute, fmt.Sprintf("Job %s to be %s", name, cond), func() (bool, string) {
		j, err := cs.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range j.Status.Conditions {
			if c.Type == cond && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", j.Status)
	})
}

func podsOf(t *testing.T, cs kubernetes.Interface, ns, selector string) []corev1.Pod {
	t.Helper()
	l, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	require.NoError(t, err)
	require.NotEmpty(t, l.Items, selector)
	return l.Items
}

// waitReadyPod waits for a Running, Ready pod of selector other than except.
func waitReadyPod(t *testing.T, cs kubernetes.Interface, ns, selector, except string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	eventually(t, 3*time.Minute, "a ready pod of "+selector, func() (bool, string) {
		l, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		for _, p := range l.Items {
			states = append(states, fmt.Sprintf("%s:%s", p.Name, p.Status.Phase))
			if p.Name == except || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					found = p
					return true, ""
				}
			}
		}
		return false, strings.Join(states, ", ")
	})
	return found
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
func requirePodSucceeded(t *testing.T, cs kubernetes.Interface, ns, name, want string) { //nolint:unparam // one namespace today
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
	executor, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	require.NoError(t, executor.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}),
		"kubectl exec, through the kubelet; stderr: %s", stderr.String())
	return stdout.String()
}

// attachToPod streams the stdout of the pod's container main (kubectl
// attach) into the returned buffer until the test ends.
func attachToPod(t *testing.T, s *cluster.State, cs kubernetes.Interface, ns, pod string) *syncbuf.Buffer {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	require.NoError(t, err)
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "main", Stdout: true, Stderr: true}, scheme.ParameterCodec)
	attach, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncbuf.Buffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := attach.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: out, Stderr: out}); err != nil && ctx.Err() == nil {
			_, _ = fmt.Fprintf(out, "[kubectl attach ended: %v]", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out
}

// portForward forwards a free local port to the pod's port (kubectl
// port-forward) until the test ends, and returns the local port.
func portForward(t *testing.T, s *cluster.State, cs kubernetes.Interface, ns, pod string, port int) int {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	require.NoError(t, err)
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	require.NoError(t, err)
	pfURL := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, pfURL)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)},
		stop, ready, io.Discard, testWriter{t})
	require.NoError(t, err)
	var fwErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		fwErr = fw.ForwardPorts()
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	select {
	case <-ready:
	case <-done:
		t.Fatalf("kubectl port-forward %s: %v", pod, fwErr)
	case <-time.After(time.Minute):
		t.Fatalf("kubectl port-forward %s: not ready after a minute", pod)
	}
	ports, err := fw.GetPorts()
	require.NoError(t, err)
	return int(ports[0].Local)
}

// requireNothingLeft checks what Down must remove: the node's processes,
// mounts, cgroups, the pods' network namespaces, the bridge, CNI's and
// kube-proxy's iptables chains.
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
	netns, _ := filepath.Glob("/run/netns/cni-*")
	require.Empty(t, netns, "pod network namespaces left behind")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil {
			require.NotContains(t, string(cmdline), s.StateDir, "process %s left behind: %q",
				e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
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
