//go:build e2e

// Package e2e is the end-to-end suite of the outbox-operator: the operator
// installed with Helm, config/samples applied, and the system driven the way a
// user drives it (kubectl, HTTP to the orders API, SQL and Redis to check the
// results). It is cluster-agnostic: the suite's cluster setup below is the
// only part that knows which cluster it runs on (E2E_CLUSTER):
//
//   - local (default): the project's local cluster without Docker, started by
//     hack/demo.sh (the cluster, PostgreSQL and Redis on the host, helm install,
//     the sample), torn down at the end unless E2E_KEEP=1;
//   - kind: a kind cluster created by `make test-e2e-kind` (the image loaded
//     into it); the suite installs the chart and the sample itself, and reaches
//     PostgreSQL, Redis and the orders API through kubectl port-forward;
//   - existing: as kind, on the cluster of the current kubeconfig.
//
// docs/e2e.md describes how to run it and every scenario.
package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

const (
	namespace   = "default"
	operatorNS  = "outbox-system"
	release     = "outbox-operator"
	relayName   = "orders"
	stream      = "jobs"
	deadStream  = "jobs.dead"
	defaultOrds = 5000
)

// cluster is what the scenarios know of the cluster under test; setUp fills
// it in, per E2E_CLUSTER.
type cluster struct {
	mode       string // local, kind, existing
	root       string // the repository's root
	stateDir   string // local: the local cluster's state dir
	kubeconfig string
	ordersURL  string // the orders API, from the test process
	pgDSN      string // PostgreSQL of the sample, from the test process
	redisURL   string // Redis of the sample, from the test process

	// killContainer SIGKILLs the main process of a pod's container.
	killContainer func(pod, container string) error

	stops []func()
}

var (
	env cluster
	db  *pgxpool.Pool
	rdb *redis.Client
	// ctx bounds every call of the suite.
	ctx    context.Context
	cancel context.CancelFunc
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	_, _ = fmt.Fprintf(GinkgoWriter, "Starting the outbox-operator end-to-end suite\n")
	RunSpecs(t, "outbox-operator e2e suite")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())
	root, err := filepath.Abs(filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	env = cluster{mode: getenv("E2E_CLUSTER", "local"), root: root}
	By(fmt.Sprintf("setting up the cluster (E2E_CLUSTER=%s)", env.mode))
	switch env.mode {
	case "local":
		setUpLocal()
	case "kind", "existing":
		setUpRemote()
	default:
		Fail("E2E_CLUSTER must be local, kind or existing, not " + env.mode)
	}

	By("connecting to PostgreSQL and Redis of the sample")
	db, err = pgxpool.New(ctx, env.pgDSN)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error { return db.Ping(ctx) }).WithTimeout(time.Minute).Should(Succeed())
	opts, err := redis.ParseURL(env.redisURL)
	Expect(err).NotTo(HaveOccurred())
	rdb = redis.NewClient(opts)
	Eventually(func() error { return rdb.Ping(ctx).Err() }).WithTimeout(time.Minute).Should(Succeed())
	Eventually(func() (int, error) { return ordersAPIStatus() }).WithTimeout(2*time.Minute).
		WithPolling(time.Second).Should(Equal(200), "orders-api /readyz from the test process")
})

var _ = AfterSuite(func() {
	if rdb != nil {
		_ = rdb.Close()
	}
	if db != nil {
		db.Close()
	}
	for i := len(env.stops) - 1; i >= 0; i-- {
		env.stops[i]()
	}
	if env.mode == "local" && os.Getenv("E2E_KEEP") != "1" && env.stateDir != "" {
		By("tearing the local cluster down (E2E_KEEP=1 keeps it)")
		cmd := exec.Command("go", "run", "./hack/localcluster", "down", "--state-dir", env.stateDir)
		cmd.Dir = env.root
		out, err := cmd.CombinedOutput()
		_, _ = GinkgoWriter.Write(out)
		Expect(err).NotTo(HaveOccurred())
	}
	if cancel != nil {
		cancel()
	}
})

// setUpLocal runs hack/demo.sh (what `make demo` runs) with no orders: the
// local cluster, PostgreSQL and Redis on the host, helm install of the chart,
// the sample. The test process reaches PostgreSQL and Redis on loopback and
// the orders API at its pod's address.
func setUpLocal() {
	if os.Geteuid() != 0 {
		msg := "the local cluster needs root (network namespaces, veth pairs, a bridge): run as root, or E2E_CLUSTER=kind"
		if os.Getenv("CI") == "true" {
			Fail(msg)
		}
		Skip(msg)
	}
	env.stateDir = getenv("LOCAL_CLUSTER_DIR", "/var/lib/outbox-local-cluster")
	helm := getenv("HELM", filepath.Join(env.root, "bin", "helm"))
	if _, err := os.Stat(helm); err != nil {
		Fail(fmt.Sprintf("helm not found at %s: run `make helm` (or set HELM)", helm))
	}
	By("starting the local cluster, PostgreSQL, Redis, the operator and the sample: hack/demo.sh")
	cmd := exec.Command(filepath.Join(env.root, "hack", "demo.sh"))
	cmd.Dir = env.root
	cmd.Env = append(os.Environ(), "ORDERS=0", "LOCAL_CLUSTER_DIR="+env.stateDir, "HELM="+helm)
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Run()).To(Succeed(), "hack/demo.sh")

	c := exec.Command("go", "run", "./hack/localcluster", "kubeconfig", "--state-dir", env.stateDir)
	c.Dir = env.root
	out, err := c.Output()
	Expect(err).NotTo(HaveOccurred())
	env.kubeconfig = strings.TrimSpace(string(out))

	b, err := os.ReadFile(filepath.Join(env.stateDir, "demo-services.json"))
	Expect(err).NotTo(HaveOccurred())
	var ep struct {
		PostgresPort int `json:"postgresPort"`
		RedisPort    int `json:"redisPort"`
	}
	Expect(json.Unmarshal(b, &ep)).To(Succeed())
	env.pgDSN, env.redisURL = sampleConnStrings("127.0.0.1", ep.PostgresPort, "127.0.0.1", ep.RedisPort)

	ip := kubectl("-n", namespace, "get", "pod", "-l", "app.kubernetes.io/name=orders-api",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].status.podIP}")
	Expect(ip).NotTo(BeEmpty())
	env.ordersURL = "http://" + ip + ":8080"

	env.killContainer = func(pod, container string) error {
		return killLocalContainer(pod, container)
	}
}

// killLocalContainer SIGKILLs a container of the local cluster's node through
// its containerd (ctr task kill), as the OOM killer or a crash would end it;
// the kubelet then restarts it, as on any node.
func killLocalContainer(pod, container string) error {
	id, err := containerdID(pod, container)
	if err != nil {
		return err
	}
	sock := filepath.Join(env.stateDir, "node", "containerd", "containerd.sock")
	out, err := exec.Command("ctr", "--address", sock, "--namespace", "k8s.io",
		"task", "kill", "--signal", "SIGKILL", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr task kill %s: %v: %s", id, err, out)
	}
	return nil
}

// containerdID is the containerd id of a container of a pod, from its status.
func containerdID(pod, container string) (string, error) {
	id := kubectl("-n", namespace, "get", "pod", pod, "-o",
		fmt.Sprintf(`jsonpath={.status.containerStatuses[?(@.name=="%s")].containerID}`, container))
	id, ok := strings.CutPrefix(id, "containerd://")
	if !ok {
		return "", fmt.Errorf("container %s of pod %s: no containerd id (%q)", container, pod, id)
	}
	return id, nil
}

// setUpRemote installs the chart and the sample on the cluster of the
// kubeconfig (kind: created and loaded with the image by make
// test-e2e-kind), and port-forwards to PostgreSQL, Redis and the orders API.
func setUpRemote() {
	env.kubeconfig = os.Getenv("KUBECONFIG")
	helm := getenv("HELM", filepath.Join(env.root, "bin", "helm"))
	tag := getenv("E2E_IMAGE_TAG", "dev")
	By("the operator's and the sample's namespaces enforce the restricted Pod Security Standard")
	for _, ns := range []string{operatorNS, namespace} {
		manifest, err := kubectlErr("create", "namespace", ns, "--dry-run=client", "-o", "yaml")
		Expect(err).NotTo(HaveOccurred())
		_, err = kubectlIn(manifest, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		kubectl(append([]string{"label", "namespace", ns, "--overwrite"}, restrictedLabels...)...)
	}
	By("installing the operator: helm upgrade --install " + release)
	cmd := exec.Command(helm, "upgrade", "--install", release, filepath.Join(env.root, "charts", "outbox-operator"),
		"--namespace", operatorNS, "--create-namespace", "--set", "image.tag="+tag,
		"--set", "image.pullPolicy=IfNotPresent", "--wait", "--timeout", "5m")
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Run()).To(Succeed())

	By("applying the sample: kubectl apply -k config/samples")
	kubectl("-n", namespace, "apply", "-k", filepath.Join(env.root, "config", "samples"))
	kubectl("-n", namespace, "wait", "--for=condition=complete", "job/orders-migrate", "--timeout=10m")
	kubectl("-n", namespace, "wait", "--for=condition=available", "deploy/orders-api", "deploy/worker", "--timeout=5m")
	Eventually(func() error { _, err := kubectlErr("-n", namespace, "get", "deploy", relayName+"-relay"); return err }).
		WithTimeout(2 * time.Minute).Should(Succeed())
	kubectl("-n", namespace, "wait", "--for=condition=available", "deploy/"+relayName+"-relay", "--timeout=5m")

	pgPort := portForward("svc/postgres", 5432)
	redisPort := portForward("svc/redis", 6379)
	apiPort := portForward("svc/orders-api", 8080)
	env.pgDSN, env.redisURL = sampleConnStrings("127.0.0.1", pgPort, "127.0.0.1", redisPort)
	env.ordersURL = fmt.Sprintf("http://127.0.0.1:%d", apiPort)

	env.killContainer = func(pod, container string) error {
		if env.mode != "kind" {
			return fmt.Errorf("SIGKILL of a container is only implemented on the local cluster and kind")
		}
		node := kubectl("-n", namespace, "get", "pod", pod, "-o", "jsonpath={.spec.nodeName}")
		id, err := containerdID(pod, container)
		if err != nil {
			return err
		}
		script := fmt.Sprintf(`kill -9 "$(crictl inspect --output go-template --template '{{.info.pid}}' %s)"`, id)
		out, err := exec.Command("docker", "exec", node, "sh", "-c", script).CombinedOutput()
		if err != nil {
			return fmt.Errorf("docker exec %s: %v: %s", node, err, out)
		}
		return nil
	}
}

// restrictedLabels make a namespace enforce the restricted Pod Security
// Standard (hack/demo.sh sets the same on the local cluster).
var restrictedLabels = []string{
	"pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
	"pod-security.kubernetes.io/warn=restricted", "pod-security.kubernetes.io/warn-version=latest",
}

// sampleConnStrings builds the DSN and Redis URL of the sample's servers at
// the given addresses, with the credentials of the sample's Secrets.
func sampleConnStrings(pgHost string, pgPort int, redisHost string, redisPort int) (string, string) {
	user := secretValue("orders-db", "username")
	pass := secretValue("orders-db", "password")
	dbName := secretValue("orders-db", "database")
	ru, err := url.Parse(secretValue("orders-redis", "url"))
	Expect(err).NotTo(HaveOccurred())
	dsn := (&url.URL{Scheme: "postgres", User: url.UserPassword(user, pass),
		Host: fmt.Sprintf("%s:%d", pgHost, pgPort), Path: "/" + dbName, RawQuery: "sslmode=disable"}).String()
	ru.Host = fmt.Sprintf("%s:%d", redisHost, redisPort)
	return dsn, ru.String()
}

func secretValue(name, key string) string {
	b64 := kubectl("-n", namespace, "get", "secret", name, "-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
	b, err := base64.StdEncoding.DecodeString(b64)
	Expect(err).NotTo(HaveOccurred())
	return string(b)
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)

// portForward runs kubectl port-forward to target on a free local port until
// the end of the suite, and returns that port.
func portForward(target string, port int) int {
	cmd := exec.Command("kubectl", "-n", namespace, "port-forward", target, fmt.Sprintf("127.0.0.1:0:%d", port))
	cmd.Env = kubeEnv()
	stdout, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	cmd.Stderr = GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	env.stops = append(env.stops, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil {
				p, _ := strconv.Atoi(m[1])
				select {
				case found <- p:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p := <-found:
		return p
	case <-time.After(time.Minute):
		Fail("kubectl port-forward " + target + " did not start")
	}
	return 0
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func kubeEnv() []string {
	e := os.Environ()
	if env.kubeconfig != "" {
		e = append(e, "KUBECONFIG="+env.kubeconfig)
	}
	return e
}

// kubectlErr runs kubectl and returns its stdout; the error carries stderr.
func kubectlErr(args ...string) (string, error) {
	return kubectlIn("", args...)
}

func kubectlIn(stdin string, args ...string) (string, error) {
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer ccancel()
	cmd := exec.CommandContext(cctx, "kubectl", args...)
	cmd.Env = kubeEnv()
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// kubectl runs kubectl and fails the spec when it fails.
func kubectl(args ...string) string {
	GinkgoHelper()
	out, err := kubectlErr(args...)
	Expect(err).NotTo(HaveOccurred())
	return strings.TrimSpace(out)
}
