//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

// orderCount is the number of orders of the load scenario (E2E_ORDERS).
func orderCount() int {
	if v := os.Getenv("E2E_ORDERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err == nil && n > 0 {
			return n
		}
	}
	return defaultOrds
}

// One ordered container: the scenarios share the sample and its relay, and
// run in this order; ContinueOnFailure lets the later ones run when one fails.
var _ = Describe("outbox-operator", Ordered, ContinueOnFailure, func() {
	BeforeAll(func() {
		By("measuring the backlog every 2s and scaling down after 20s, so that the scenarios take seconds, not minutes")
		patchRelay(`{"spec":{"backlog":{"checkInterval":"2s"},"replicas":{"scaleDownStabilizationWindow":"20s"}}}`)
		waitRelayReady(relayName, 3*time.Minute)
	})

	AfterEach(func() {
		if CurrentSpecReport().Failed() {
			for _, args := range [][]string{
				{"-n", namespace, "get", "outboxrelays,deploy,cronjobs,jobs,pods", "-o", "wide"},
				{"-n", namespace, "get", "outboxrelays", "-o", "yaml"},
				{"-n", operatorNS, "logs", "deploy/" + release, "--tail=60"},
				{"-n", namespace, "logs", "deploy/worker", "--tail=30"},
			} {
				out, err := kubectlErr(args...)
				_, _ = fmt.Fprintf(GinkgoWriter, "\n$ kubectl %s\n%s%v\n", strings.Join(args, " "), out, err)
			}
		}
	})

	// 1. The reference scenario of docs/sample.md.
	It("keeps an order in the backlog while suspended and emails it exactly once after resuming", func() {
		By("suspending the relay")
		patchRelay(`{"spec":{"suspend":true}}`)
		DeferCleanup(func() { patchRelay(`{"spec":{"suspend":false}}`) })
		Eventually(func() (int, error) { return jsonpathInt("deploy", relayName+"-relay", "{.spec.replicas}") }).
			WithTimeout(time.Minute).Should(Equal(0))
		waitRelayPodsGone(relayName)
		Eventually(func() (string, error) { return getColumn(relayName, "BACKLOG") }).WithTimeout(time.Minute).Should(Equal("0"))
		streamBefore := streamLen(stream)

		By("placing an order: POST /orders")
		order, err := placeOrder("reader@example.com", "19.99")
		Expect(err).NotTo(HaveOccurred())
		events := eventIDsOf([]string{order})
		Expect(events).To(HaveKey(order), "the order's outbox row, written in the order's transaction")
		event := events[order]
		Expect(undispatched("outbox_events", []string{event})).To(Equal(1))

		By("kubectl get outboxrelays shows BACKLOG 1")
		Eventually(func() (string, error) { return getColumn(relayName, "BACKLOG") }).WithTimeout(time.Minute).
			WithPolling(time.Second).Should(Equal("1"))
		Expect(getColumn(relayName, "OLDEST")).NotTo(BeEmpty())
		Expect(condition(relayName, "Ready")).To(Equal("False/Suspended"))
		Consistently(func() int64 { return streamLen(stream) }).WithTimeout(3*time.Second).Should(Equal(streamBefore),
			"nothing reaches the stream while suspended")
		Expect(emailed([]string{order})).To(Equal(0))

		By("resuming the relay")
		patchRelay(`{"spec":{"suspend":false}}`)
		Eventually(func() (int, error) { return emailed([]string{order}) }).WithTimeout(2 * time.Minute).
			WithPolling(time.Second).Should(Equal(1))
		Expect(undispatched("outbox_events", []string{event})).To(Equal(0))
		counts := streamCounts(stream, map[string]bool{event: true})
		Expect(counts[event]).To(Equal(1), "one stream entry for the event")
		Eventually(func() int { return workerEmailLines(order) }).WithTimeout(30 * time.Second).Should(Equal(1))
		Consistently(func() int { return workerEmailLines(order) }).WithTimeout(5*time.Second).
			WithPolling(time.Second).Should(Equal(1), "exactly one email")
		Expect(processedCount([]string{event})).To(Equal(1))

		By("kubectl get outboxrelays shows BACKLOG 0")
		Eventually(func() (string, error) { return getColumn(relayName, "BACKLOG") }).WithTimeout(time.Minute).Should(Equal("0"))
		waitRelayReady(relayName, 2*time.Minute)
		Expect(streamLen(deadStream)).To(BeZero())
	})

	// Pod Security as users run it.
	It("runs the operator, the relays and the sample in namespaces that enforce restricted Pod Security", func() {
		for _, ns := range []string{operatorNS, namespace} {
			Expect(kubectl("get", "namespace", ns, "-o", `jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}`)).
				To(Equal("restricted"), "namespace %s", ns)
		}
		By("the API server enforces it: a privileged pod is refused")
		_, err := kubectlIn(`apiVersion: v1
kind: Pod
metadata: {name: e2e-privileged}
spec:
  containers: [{name: c, image: busybox, securityContext: {privileged: true}}]
`, "-n", namespace, "create", "--dry-run=server", "-f", "-")
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("violates PodSecurity"))

		By("so everything that runs there was admitted under it")
		Expect(kubectl("-n", operatorNS, "get", "pods", "-l", "app.kubernetes.io/name=outbox-operator",
			"--field-selector=status.phase=Running", "-o", "name")).NotTo(BeEmpty(), "the operator")
		apps := []string{"outbox-relay", "orders-api", "worker"}
		if env.mode != "local" { // the local cluster runs PostgreSQL and Redis on the host
			apps = append(apps, "postgres", "redis")
		}
		for _, app := range apps {
			Expect(kubectl("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name="+app,
				"--field-selector=status.phase=Running", "-o", "name")).NotTo(BeEmpty(), app)
		}
	})

	// 7a. Admission.
	It("refuses invalid OutboxRelays with their messages", func() {
		base := func(name, spec string) string {
			return fmt.Sprintf(`apiVersion: relay.outbox.dev/v1alpha1
kind: OutboxRelay
metadata: {name: %s}
spec:
  postgres: {dsnSecretRef: {name: orders-db, key: dsn}%s}
  redis: {urlSecretRef: {name: orders-redis, key: url}, stream: e2e-invalid}
%s`, name, "", spec)
		}
		inPostgres := func(name, extra string) string {
			return strings.Replace(base(name, ""), "key: dsn}", "key: dsn}, "+extra, 1)
		}
		long := "e2e-a-name-that-is-far-too-long-for-its-cronjob-x"
		for _, c := range []struct{ name, manifest, message string }{
			{"e2e-bad-table", inPostgres("e2e-bad-table", `table: "x; DROP TABLE y"`), "must be table or schema.table"},
			{"e2e-bad-replicas", base("e2e-bad-replicas", "  replicas: {min: 3}"), "replicas.min must not be greater than replicas.max"},
			{"e2e-bad-columns", inPostgres("e2e-bad-columns", "columns: {id: event_type}"), "columns must name five different columns"},
			{"e2e-bad-schedule", base("e2e-bad-schedule", `  cleanup: {schedule: "@hourly"}`), "cleanup.schedule must be a cron expression"},
			{"e2e-bad-interval", base("e2e-bad-interval", `  backlog: {checkInterval: 100ms}`), "backlog.checkInterval must be between 1s and 1h"},
			{"e2e-bad-retention", base("e2e-bad-retention", `  cleanup: {retention: 10s}`), "cleanup.retention must be between 1m and 8760h"},
			{"e2e-bad-stream", strings.Replace(base("e2e-bad-stream", ""), "stream: e2e-invalid", `stream: "a b"`, 1), "must be a stream name"},
			{long, base(long, ""), "metadata.name must be at most 44 characters"},
			{"e2e-bad-perkey", base("e2e-bad-perkey", "  ordering: PerKey"), "ordering PerKey needs postgres.columns.key"},
			{"e2e-bad-key", strings.Replace(base("e2e-bad-key", "  ordering: PerKey"), "key: dsn}", "key: dsn}, columns: {key: payload}", 1),
				"columns.key must name a column other than the five others"},
			{"e2e-bad-key-renamed", inPostgres("e2e-bad-key-renamed", "columns: {id: event_id, key: event_id}"),
				"columns.key must name a column other than the five others"},
		} {
			By("kubectl apply of " + c.name)
			out, err := kubectlIn(c.manifest, "-n", namespace, "apply", "-f", "-")
			Expect(err).To(HaveOccurred(), "applied: %s", out)
			Expect(err.Error()).To(ContainSubstring(c.message))
			_, err = kubectlErr("-n", namespace, "get", "outboxrelay", c.name)
			Expect(err).To(HaveOccurred(), "nothing was created")
		}
		Expect(streamLen("e2e-invalid")).To(BeZero())
	})

	// 4. The cleanup CronJob, on demand.
	It("deletes dispatched rows older than the retention, and nothing else, when the cleanup CronJob runs", func() {
		By("suspending the relay, so that the old pending row stays pending")
		patchRelay(`{"spec":{"suspend":true}}`)
		DeferCleanup(func() { patchRelay(`{"spec":{"suspend":false}}`) })
		waitRelayPodsGone(relayName)

		var before int
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&before)).To(Succeed())
		streamBefore := streamLen(stream)
		By("seeding rows around the retention (72h)")
		rows := map[string]string{ // label -> id
			"old-dispatched":    "",
			"inside-retention":  "",
			"recent-dispatched": "",
			"old-pending":       "",
		}
		for label, q := range map[string]string{
			"old-dispatched":    `now() - interval '201 hours', now() - interval '200 hours'`,
			"inside-retention":  `now() - interval '72 hours', now() - interval '71 hours'`,
			"recent-dispatched": `now() - interval '2 hours', now() - interval '1 hour'`,
			"old-pending":       `now() - interval '300 hours', NULL`,
		} {
			var id string
			Expect(db.QueryRow(ctx, `INSERT INTO outbox_events (id, event_type, payload, created_at, dispatched_at)
				VALUES (gen_random_uuid(), 'e2e_cleanup_probe', '{"label":"`+label+`"}', `+q+`) RETURNING id::text`).Scan(&id)).To(Succeed())
			rows[label] = id
		}
		DeferCleanup(func() {
			_, _ = db.Exec(ctx, `DELETE FROM outbox_events WHERE event_type = 'e2e_cleanup_probe'`)
		})

		By("kubectl create job --from=cronjob/" + relayName + "-cleanup")
		job := fmt.Sprintf("e2e-cleanup-%d", time.Now().Unix())
		kubectl("-n", namespace, "create", "job", job, "--from=cronjob/"+relayName+"-cleanup")
		DeferCleanup(func() { _, _ = kubectlErr("-n", namespace, "delete", "job", job, "--wait=false") })
		kubectl("-n", namespace, "wait", "--for=condition=complete", "job/"+job, "--timeout=3m")

		exists := func(id string) bool {
			var n int
			Expect(db.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE id::text = $1`, id).Scan(&n)).To(Succeed())
			return n == 1
		}
		Expect(exists(rows["old-dispatched"])).To(BeFalse(), "dispatched 200h ago: deleted")
		Expect(exists(rows["inside-retention"])).To(BeTrue(), "dispatched 71h ago: kept")
		Expect(exists(rows["recent-dispatched"])).To(BeTrue(), "dispatched 1h ago: kept")
		Expect(exists(rows["old-pending"])).To(BeTrue(), "never dispatched: kept, however old")
		var after int
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&after)).To(Succeed())
		Expect(after).To(Equal(before+4-1), "exactly one row deleted")
		Expect(streamLen(stream)).To(Equal(streamBefore), "the stream is not touched by the cleanup")
		logs := kubectl("-n", namespace, "logs", "job/"+job)
		Expect(logs).NotTo(ContainSubstring("demo-password"), "no password in the cleanup's logs")
	})

	// 2. A burst of orders: scale-up from the backlog, exactly one email each, scale-down.
	It("scales the relays up from the backlog, emails every order exactly once, and scales back down", func() {
		n := orderCount()
		max, err := jsonpathInt("outboxrelay", relayName, "{.spec.replicas.max}")
		Expect(err).NotTo(HaveOccurred())
		Expect(max).To(BeNumerically(">", 1))
		if n < 1000*max {
			target := (n + max) / (max + 1)
			By(fmt.Sprintf("E2E_ORDERS=%d is small: targetBacklogPerReplica %d, so that the backlog asks for %d relays", n, target, max))
			patchRelay(fmt.Sprintf(`{"spec":{"replicas":{"targetBacklogPerReplica":%d}}}`, target))
			DeferCleanup(func() { patchRelay(`{"spec":{"replicas":{"targetBacklogPerReplica":1000}}}`) })
		}

		By("suspending the relay while the orders are placed, so that the backlog is measured whole")
		patchRelay(`{"spec":{"suspend":true}}`)
		DeferCleanup(func() { patchRelay(`{"spec":{"suspend":false}}`) })
		waitRelayPodsGone(relayName)

		By(fmt.Sprintf("placing %d orders, 16 at a time", n))
		start := time.Now()
		orders := placeOrders("load", n, 16, nil)
		_, _ = fmt.Fprintf(GinkgoWriter, "placed %d orders in %s\n", n, time.Since(start).Round(time.Millisecond))
		Eventually(func() (int, error) { return jsonpathInt("outboxrelay", relayName, "{.status.backlog}") }).
			WithTimeout(time.Minute).Should(BeNumerically(">=", n))

		By("resuming: the relays scale up to replicas.max from the backlog")
		var maxSeen atomic.Int64
		stop := make(chan struct{})
		watcherDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(watcherDone)
			for {
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
				if r, err := jsonpathInt("deploy", relayName+"-relay", "{.status.readyReplicas}"); err == nil && int64(r) > maxSeen.Load() {
					maxSeen.Store(int64(r))
				}
			}
		}()
		DeferCleanup(func() { close(stop); <-watcherDone })
		drain := time.Now()
		patchRelay(`{"spec":{"suspend":false}}`)
		Eventually(func() (int, error) { return jsonpathInt("deploy", relayName+"-relay", "{.spec.replicas}") }).
			WithTimeout(time.Minute).Should(Equal(max))

		By("every order is emailed exactly once (sent_emails)")
		Eventually(func() (int, error) { return emailed(orders) }).WithTimeout(15 * time.Minute).
			WithPolling(2 * time.Second).Should(Equal(n))
		_, _ = fmt.Fprintf(GinkgoWriter, "drained and emailed %d orders in %s; most ready relays seen: %d\n",
			n, time.Since(drain).Round(time.Millisecond), maxSeen.Load())
		events := eventIDsOf(orders)
		Expect(events).To(HaveLen(n))
		eventIDs := values(events)
		Expect(undispatched("outbox_events", eventIDs)).To(Equal(0))
		counts := streamCounts(stream, set(eventIDs))
		Expect(counts).To(HaveLen(n), "every event reached the stream")
		dups := 0
		for _, c := range counts {
			dups += c - 1
		}
		_, _ = fmt.Fprintf(GinkgoWriter, "stream duplicates: %d\n", dups)
		Expect(processedCount(eventIDs)).To(Equal(n))
		Expect(streamLen(deadStream)).To(BeZero())

		By("the relays return to replicas.min")
		minR, err := jsonpathInt("outboxrelay", relayName, "{.spec.replicas.min}")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() (int, error) { return jsonpathInt("deploy", relayName+"-relay", "{.spec.replicas}") }).
			WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Equal(minR))
		Eventually(func() []string { return relayPods(relayName) }).WithTimeout(2 * time.Minute).Should(HaveLen(minR))
		Eventually(func() (string, error) { return getColumn(relayName, "BACKLOG") }).WithTimeout(time.Minute).Should(Equal("0"))
		Expect(maxSeen.Load()).To(BeNumerically(">", int64(minR)), "the relays scaled up")
	})

	// 3. Relay pods deleted and SIGKILLed under load.
	It("loses nothing and absorbs duplicates when relay pods are deleted and SIGKILLed under load", func() {
		n := orderCount() / 2
		if n < 200 {
			n = 200
		}
		By("running two relays")
		patchRelay(`{"spec":{"replicas":{"min":2}}}`)
		DeferCleanup(func() { patchRelay(`{"spec":{"replicas":{"min":1}}}`) })
		Eventually(func() []string { return readyRelayPods(relayName) }).WithTimeout(2 * time.Minute).Should(HaveLen(2))
		pods := readyRelayPods(relayName)

		By(fmt.Sprintf("placing %d orders over 30s while one relay pod is deleted and the other SIGKILLed", n))
		var placed atomic.Int64
		done := make(chan []string, 1)
		go func() {
			defer GinkgoRecover()
			done <- placeOrdersOver("faults", n, 8, 30*time.Second, &placed)
		}()
		Eventually(func() int64 { return placed.Load() }).WithTimeout(5 * time.Minute).Should(BeNumerically(">=", n/4))
		kubectl("-n", namespace, "delete", "pod", pods[0], "--wait=false")
		Eventually(func() int64 { return placed.Load() }).WithTimeout(5 * time.Minute).Should(BeNumerically(">=", n/2))
		restarts := func() (int, error) {
			return jsonpathInt("pod", pods[1], "{.status.containerStatuses[0].restartCount}")
		}
		r0, err := restarts()
		Expect(err).NotTo(HaveOccurred())
		Expect(env.killContainer(pods[1], "relay")).To(Succeed())
		var orders []string
		Eventually(done).WithTimeout(10 * time.Minute).Should(Receive(&orders))

		By("the SIGKILLed relay restarted, the deleted one was replaced")
		Eventually(restarts).WithTimeout(2 * time.Minute).Should(BeNumerically(">", r0))
		Eventually(func() []string { return readyRelayPods(relayName) }).WithTimeout(3 * time.Minute).
			Should(SatisfyAll(HaveLen(2), Not(ContainElement(pods[0]))))

		By("every order is emailed exactly once")
		Eventually(func() (int, error) { return emailed(orders) }).WithTimeout(10 * time.Minute).
			WithPolling(2 * time.Second).Should(Equal(n))
		events := eventIDsOf(orders)
		Expect(events).To(HaveLen(n))
		eventIDs := values(events)
		Expect(undispatched("outbox_events", eventIDs)).To(Equal(0))
		counts := streamCounts(stream, set(eventIDs))
		Expect(counts).To(HaveLen(n), "every event reached the stream")
		dups := 0
		for _, c := range counts {
			dups += c - 1
		}
		_, _ = fmt.Fprintf(GinkgoWriter, "stream duplicates absorbed by the worker: %d\n", dups)
		Expect(processedCount(eventIDs)).To(Equal(n))
		Expect(streamLen(deadStream)).To(BeZero())

		By("a republished entry, what a relay killed between XADD and commit leaves behind, is absorbed")
		order := orders[0]
		entry := streamEntry(stream, events[order])
		Expect(entry).NotTo(BeNil())
		Expect(rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
			"event_id", entry["event_id"], "event_type", entry["event_type"], "payload", entry["payload"],
		}}).Err()).To(Succeed())
		Eventually(func() (string, error) {
			groups, err := rdb.XInfoGroups(ctx, stream).Result()
			if err != nil {
				return "", err
			}
			for _, g := range groups {
				if g.Name == "workers" {
					return fmt.Sprintf("lag=%d pending=%d", g.Lag, g.Pending), nil
				}
			}
			return "", fmt.Errorf("no group workers")
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("lag=0 pending=0"))
		Expect(emailed([]string{order})).To(Equal(1))
		Expect(workerEmailLines(order)).To(Equal(1))
		Expect(streamLen(deadStream)).To(BeZero())
	})

	// 5. The operator restarted in the middle of a reconcile.
	It("converges after the operator pod is deleted mid-reconcile, with no child duplicated", func() {
		lease := "outbox-operator.relay.outbox.dev"
		holder := func() string {
			out, _ := kubectlErr("-n", operatorNS, "get", "lease", lease, "-o", "jsonpath={.spec.holderIdentity}")
			return strings.TrimSpace(out)
		}
		Eventually(holder).WithTimeout(time.Minute).ShouldNot(BeEmpty())
		oldHolder := holder()
		oldPod := kubectl("-n", operatorNS, "get", "pods", "-l", "app.kubernetes.io/component=controller-manager",
			"-o", "jsonpath={.items[0].metadata.name}")

		By("changing the spec and deleting the operator pod at once")
		patchRelay(`{"spec":{"relay":{"batchSize":400}}}`)
		DeferCleanup(func() { patchRelay(`{"spec":{"relay":{"batchSize":500}}}`) })
		kubectl("-n", operatorNS, "delete", "pod", oldPod, "--wait=false")

		By("a new operator pod takes the lease")
		Eventually(holder).WithTimeout(3 * time.Minute).WithPolling(time.Second).
			Should(SatisfyAll(Not(BeEmpty()), Not(Equal(oldHolder)), Not(ContainSubstring(oldPod))))

		By("the relay converges")
		gen := kubectl("-n", namespace, "get", "outboxrelay", relayName, "-o", "jsonpath={.metadata.generation}")
		Eventually(func() (string, error) { return jsonpath("outboxrelay", relayName, "{.status.observedGeneration}") }).
			WithTimeout(2 * time.Minute).Should(Equal(gen))
		Eventually(func() (string, error) {
			return jsonpath("deploy", relayName+"-relay", "{.spec.template.spec.containers[0].args}")
		}).WithTimeout(time.Minute).Should(ContainSubstring("--batch-size=400"))
		waitRelayReady(relayName, 3*time.Minute)

		By("one Deployment, one CronJob, one active ReplicaSet")
		sel := "app.kubernetes.io/instance=" + relayName + ",app.kubernetes.io/managed-by=outbox-operator"
		Expect(strings.Fields(kubectl("-n", namespace, "get", "deploy", "-l", sel, "-o", "jsonpath={.items[*].metadata.name}"))).
			To(Equal([]string{relayName + "-relay"}))
		Expect(strings.Fields(kubectl("-n", namespace, "get", "cronjob", "-l", sel, "-o", "jsonpath={.items[*].metadata.name}"))).
			To(Equal([]string{relayName + "-cleanup"}))
		Eventually(func() []string {
			out, _ := kubectlErr("-n", namespace, "get", "rs", "-l", "app.kubernetes.io/component=relay,app.kubernetes.io/instance="+relayName,
				"-o", `go-template={{range .items}}{{if gt .spec.replicas 0}}{{.metadata.name}} {{end}}{{end}}`)
			return strings.Fields(out)
		}).WithTimeout(2 * time.Minute).Should(HaveLen(1))

		By("orders still flow: each emailed exactly once")
		orders := placeOrders("after-operator-restart", 20, 4, nil)
		Eventually(func() (int, error) { return emailed(orders) }).WithTimeout(2 * time.Minute).Should(Equal(len(orders)))
		events := eventIDsOf(orders)
		Expect(processedCount(values(events))).To(Equal(len(orders)))
		counts := streamCounts(stream, set(values(events)))
		Expect(counts).To(HaveLen(len(orders)))
	})

	// Issue 12: Strict across a rollout, PerKey during a scale-up, each on
	// an OutboxRelay, table and stream of its own (ordering_test.go).
	orderingScenarios()

	// Issue 16: cleanup.mode OnDispatch on an OutboxRelay, table and stream
	// of its own (cleanup_mode_test.go).
	cleanupModeScenarios()

	// Issue 16: source LogicalReplication on an OutboxRelay, table and
	// stream of its own, on the local cluster (replication_test.go).
	replicationScenarios()

	// The kubectl plugin (plugin_test.go): against the sample's relay, and an
	// OutboxRelay, table and stream of its own for dead letters and replay.
	pluginScenarios()

	// 7b and 6: a second OutboxRelay, on a table of its own so that it never
	// takes the sample's events.
	Context("a second OutboxRelay", Ordered, func() {
		const (
			name   = "e2e-secrets"
			table  = "e2e_outbox"
			sname  = "e2e-conn"
			stream = "e2e-stream"
		)
		insert := func(label string) string {
			var id string
			q := `INSERT INTO ` + table + ` (event_type, payload) VALUES ('e2e_probe', $1) RETURNING id::text`
			Expect(db.QueryRow(ctx, q, label).Scan(&id)).To(Succeed())
			return id
		}
		inStream := func(id string) func() int {
			return func() int {
				c := streamCounts(stream, map[string]bool{id: true})
				return c[id]
			}
		}

		BeforeAll(func() {
			_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
				id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
				event_type text NOT NULL,
				payload text NOT NULL,
				created_at timestamptz NOT NULL DEFAULT now(),
				dispatched_at timestamptz)`)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() {
				_, _ = kubectlErr("-n", namespace, "delete", "outboxrelay", name, "--ignore-not-found")
				_, _ = kubectlErr("-n", namespace, "delete", "secret", sname, "--ignore-not-found")
				_, _ = db.Exec(ctx, `DROP TABLE IF EXISTS `+table)
				_, _ = rdb.Del(ctx, stream).Result()
			})
		})

		It("reports a missing Secret, recovers when it appears, and rolls the relays when it rotates", func() {
			By("an OutboxRelay whose Secret does not exist yet")
			_, err := kubectlIn(fmt.Sprintf(`apiVersion: relay.outbox.dev/v1alpha1
kind: OutboxRelay
metadata: {name: %s}
spec:
  postgres: {dsnSecretRef: {name: %s, key: dsn}, table: %s}
  redis: {urlSecretRef: {name: %s, key: url}, stream: %s}
  backlog: {checkInterval: 2s}
`, name, sname, table, sname, stream), "-n", namespace, "apply", "-f", "-")
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() string { return condition(name, "Ready") }).WithTimeout(time.Minute).
				Should(Equal("False/SecretNotFound"))
			Expect(conditionMessage(name, "Ready")).To(ContainSubstring(sname))
			Expect(getColumn(name, "READY")).To(Equal("False"))
			Eventually(func() string {
				out, _ := kubectlErr("-n", namespace, "get", "events", "--field-selector", "involvedObject.name="+name,
					"-o", "jsonpath={.items[*].reason}")
				return out
			}).WithTimeout(time.Minute).Should(ContainSubstring("SecretNotFound"))
			pending := insert("before the secret")
			Consistently(inStream(pending)).WithTimeout(3 * time.Second).Should(Equal(0))

			By("creating the Secret")
			dsn := secretValue("orders-db", "dsn")
			url := secretValue("orders-redis", "url")
			kubectl("-n", namespace, "create", "secret", "generic", sname, "--from-literal=dsn="+dsn, "--from-literal=url="+url)
			waitRelayReady(name, 3*time.Minute)
			Eventually(inStream(pending)).WithTimeout(time.Minute).Should(Equal(1))
			Expect(undispatched(table, []string{pending})).To(Equal(0))

			By("rotating the Secret")
			hash := func() (string, error) {
				return jsonpath("deploy", name+"-relay", `{.spec.template.metadata.annotations.relay\.outbox\.dev/secret-hash}`)
			}
			oldHash, err := hash()
			Expect(err).NotTo(HaveOccurred())
			Expect(oldHash).NotTo(BeEmpty())
			oldPods := relayPods(name)
			Expect(oldPods).NotTo(BeEmpty())
			rotated := dsn + "&application_name=e2e-rotated"
			if !strings.Contains(dsn, "?") {
				rotated = dsn + "?application_name=e2e-rotated"
			}
			manifest := kubectl("-n", namespace, "create", "secret", "generic", sname, "--from-literal=dsn="+rotated,
				"--from-literal=url="+url, "--dry-run=client", "-o", "yaml")
			_, err = kubectlIn(manifest, "-n", namespace, "apply", "-f", "-")
			Expect(err).NotTo(HaveOccurred())
			Eventually(hash).WithTimeout(time.Minute).ShouldNot(Equal(oldHash))
			Eventually(func() []string { return readyRelayPods(name) }).WithTimeout(3 * time.Minute).
				Should(SatisfyAll(Not(BeEmpty()), Not(ContainElements(oldPods))))
			Eventually(func() []string { return relayPods(name) }).WithTimeout(3 * time.Minute).
				ShouldNot(ContainElement(BeElementOf(oldPods)))
			waitRelayReady(name, 3*time.Minute)
			after := insert("after the rotation")
			Eventually(inStream(after)).WithTimeout(time.Minute).Should(Equal(1))
		})

		// 6. Garbage collection.
		It("has its Deployment and CronJob removed by the garbage collector when deleted", func() {
			uid := kubectl("-n", namespace, "get", "outboxrelay", name, "-o", "jsonpath={.metadata.uid}")
			for _, child := range []string{"deploy/" + name + "-relay", "cronjob/" + name + "-cleanup"} {
				Expect(kubectl("-n", namespace, "get", child, "-o", "jsonpath={.metadata.ownerReferences[0].uid}")).To(Equal(uid))
			}
			By("kubectl delete outboxrelay " + name)
			kubectl("-n", namespace, "delete", "outboxrelay", name, "--wait=true", "--timeout=2m")
			for _, child := range []string{"deploy/" + name + "-relay", "cronjob/" + name + "-cleanup"} {
				Eventually(func() string {
					_, err := kubectlErr("-n", namespace, "get", child)
					if err == nil {
						return "exists"
					}
					return err.Error()
				}).WithTimeout(2*time.Minute).Should(ContainSubstring("NotFound"), child)
			}
			waitRelayPodsGone(name)

			By("nothing relays the table any more")
			before := streamLen(stream)
			left := insert("after the deletion")
			Consistently(func() int64 { return streamLen(stream) }).WithTimeout(5 * time.Second).Should(Equal(before))
			Expect(undispatched(table, []string{left})).To(Equal(1))

			By("the sample's relay is untouched")
			Expect(kubectl("-n", namespace, "get", "deploy", relayName+"-relay", "-o", "name")).NotTo(BeEmpty())
		})
	})
})
