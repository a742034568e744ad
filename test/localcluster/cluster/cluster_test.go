//go:build localcluster

package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/test/localcluster/cluster"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The two images of this repo (the Dockerfile's targets): the operator's and
// the sample's.
const (
	image       = cluster.ProjectImage + ":dev"
	sampleImage = cluster.SampleImage + ":dev"
)

// requireLocalCluster skips (fails in CI) unless the machine can run a
// cluster. The file is built only with -tags localcluster (make
// test-local-cluster), so that `go test ./...` does not start clusters.
func requireLocalCluster(t *testing.T) {
	t.Helper()
	missing := func(msg string) {
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		missing("the local cluster needs root (network namespaces, veth pairs, a bridge)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		missing("`ip` is missing: apt-get install -y iproute2")
	}
}

// startCluster brings a cluster up in a temp dir on its own bridge and pod
// range, and brings it down (every process by pid, the network, the files)
// at cleanup.
func startCluster(t *testing.T) (*cluster.State, kubernetes.Interface) {
	t.Helper()
	dir := t.TempDir()
	// Pods run as their runAsUser and must reach the binaries in dir.
	for d := dir; d != "/tmp" && d != "/" && d != "."; d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	s, err := cluster.Up(ctx, cluster.Options{
		StateDir: dir, RepoDir: repo, PodCIDR: "10.250.0.0/16", ServiceCIDR: "10.97.0.0/16", Bridge: "obxt0",
		NodeName: "test-node", Out: testWriter{t},
	})
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				dumpLogs(t, s)
			}
			require.NoError(t, cluster.Down(s, false))
			for _, f := range []string{"/run/netns/obxt0-svc"} {
				_, err := os.Stat(f)
				require.True(t, os.IsNotExist(err), "%s left behind", f)
			}
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

func dumpLogs(t *testing.T, s *cluster.State) {
	b, _ := os.ReadFile(filepath.Join(s.LogDir(), "node.log"))
	lines := strings.Split(string(b), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	t.Logf("node.log (tail):\n%s", strings.Join(lines, "\n"))
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

func TestLocalClusterRunsDeploymentsAndJobs(t *testing.T) {
	requireLocalCluster(t)
	pg := testenv.StartPostgres(t)
	s, cs := startCluster(t)
	ctx := context.Background()
	ns := "default"

	// PostgreSQL runs on the host: a Service without selector whose
	// EndpointSlice points at the gateway (the host's side of the pod network).
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
	dsn.Host = "db:5432"
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"dsn": dsn.String()},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	dbEnv := []corev1.EnvVar{{Name: "DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "dsn"}}}}

	t.Log("A Job of this repo's binary runs to completion")
	migrate := job("migrate", sampleImage, corev1.RestartPolicyOnFailure, []string{"/orders-api", "migrate", "--timeout=1m"}, dbEnv)
	_, err = cs.BatchV1().Jobs(ns).Create(ctx, migrate, metav1.CreateOptions{})
	require.NoError(t, err)
	waitJob(t, cs, ns, "migrate", batchv1.JobComplete)
	pods := podsOf(t, cs, ns, "job-name=migrate")
	require.Equal(t, corev1.PodSucceeded, pods[0].Status.Phase)
	logs, err := cs.CoreV1().Pods(ns).GetLogs(pods[0].Name, &corev1.PodLogOptions{}).Do(ctx).Raw()
	require.NoError(t, err, "kubectl logs goes through the node's kubelet API")
	t.Logf("migrate logs: %s", logs)

	t.Log("A failing Job fails, with the exit code in the container status")
	_, err = cs.BatchV1().Jobs(ns).Create(ctx, job("fails", image, corev1.RestartPolicyNever, []string{"/relay", "no-such-command"}, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	waitJob(t, cs, ns, "fails", batchv1.JobFailed)
	failed := podsOf(t, cs, ns, "job-name=fails")[0]
	require.Equal(t, corev1.PodFailed, failed.Status.Phase)
	require.NotNil(t, failed.Status.ContainerStatuses[0].State.Terminated)
	require.NotZero(t, failed.Status.ContainerStatuses[0].State.Terminated.ExitCode)

	t.Log("A pod of an image the node cannot run fails with a clear reason")
	_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "postgres"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres:16"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(t, time.Minute, "the postgres:16 pod to fail", func() (bool, string) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "postgres", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnsupportedImage", fmt.Sprintf("%s %s %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
	})

	t.Log("A Deployment's pod runs and gets ready (readiness probe on a named port)")
	dep := deployment("orders-api", dbEnv)
	_, err = cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{})
	require.NoError(t, err)
	first := waitReadyPod(t, cs, ns, "app=orders-api", "")

	t.Log("The pod answers on its own address; the order reaches PostgreSQL through the Service")
	resp, err := http.Post(fmt.Sprintf("http://%s:8080/orders", first.Status.PodIP), "application/json",
		strings.NewReader(`{"customer_email": "t@example.com", "amount": "1.00"}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
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
	require.NoError(t, cs.AppsV1().Deployments(ns).Delete(ctx, "orders-api", metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationBackground)}))
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
