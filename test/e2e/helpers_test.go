//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

var httpClient = &http.Client{Timeout: 30 * time.Second}

func ordersAPIStatus() (int, error) {
	resp, err := httpClient.Get(env.ordersURL + "/readyz")
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	return resp.StatusCode, nil
}

// placeOrder POSTs one order the way the sample's README does; it returns
// the order's id.
func placeOrder(email, amount string) (string, error) {
	body, _ := json.Marshal(map[string]string{"customer_email": email, "amount": amount})
	resp, err := httpClient.Post(env.ordersURL+"/orders", "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	var out map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("POST /orders: %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("POST /orders: %d: %v", resp.StatusCode, out)
	}
	return out["order_id"], nil
}

// placeOrders places n orders with the given concurrency (a failed POST is
// retried a few times, as a client would); progress counts the placed ones.
func placeOrders(prefix string, n, concurrency int, progress *atomic.Int64) []string {
	GinkgoHelper()
	return placeOrdersOver(prefix, n, concurrency, 0, progress)
}

// placeOrdersOver places the orders spread over about the given duration
// (0: as fast as they go).
func placeOrdersOver(prefix string, n, concurrency int, over time.Duration, progress *atomic.Int64) []string {
	GinkgoHelper()
	ids := make([]string, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if over > 0 {
					if d := time.Until(begin.Add(over * time.Duration(i) / time.Duration(n))); d > 0 {
						time.Sleep(d)
					}
				}
				for attempt := 0; attempt < 5; attempt++ {
					ids[i], errs[i] = placeOrder(fmt.Sprintf("%s-%d@example.com", prefix, i), fmt.Sprintf("%d.%02d", 1+i%500, i%100))
					if errs[i] == nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if progress != nil {
					progress.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		Expect(err).NotTo(HaveOccurred(), "order %d", i)
	}
	return ids
}

// eventIDsOf maps each order to the id of its order_created outbox row.
func eventIDsOf(orderIDs []string) map[string]string {
	GinkgoHelper()
	rows, err := db.Query(ctx, `SELECT payload::text::jsonb->>'order_id', id::text FROM outbox_events
		WHERE event_type = 'order_created' AND payload::text::jsonb->>'order_id' = ANY($1)`, orderIDs)
	Expect(err).NotTo(HaveOccurred())
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var o, e string
		Expect(rows.Scan(&o, &e)).To(Succeed())
		m[o] = e
	}
	Expect(rows.Err()).NotTo(HaveOccurred())
	return m
}

// emailed counts the sent_emails rows of the orders (order_id is its primary
// key: one email per order at most).
func emailed(orderIDs []string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM sent_emails WHERE order_id::text = ANY($1)`, orderIDs).Scan(&n)
	return n, err
}

// processedCount counts the processed_events rows of the events.
func processedCount(eventIDs []string) int {
	GinkgoHelper()
	var n int
	Expect(db.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE event_id::text = ANY($1)`, eventIDs).Scan(&n)).To(Succeed())
	return n
}

func undispatched(table string, ids []string) (int, error) {
	var n int
	err := db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE dispatched_at IS NULL AND id::text = ANY($1)`, table), ids).Scan(&n)
	return n, err
}

// streamCounts reads the whole stream and counts the entries of each event id
// of want (nil: of every event id).
func streamCounts(name string, want map[string]bool) map[string]int {
	GinkgoHelper()
	counts := map[string]int{}
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, name, start, "+", 2000).Result()
		Expect(err).NotTo(HaveOccurred())
		for _, m := range msgs {
			id, _ := m.Values["event_id"].(string)
			if want == nil || want[id] {
				counts[id]++
			}
		}
		if len(msgs) < 2000 {
			return counts
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

func streamLen(name string) int64 {
	GinkgoHelper()
	n, err := rdb.XLen(ctx, name).Result()
	if err == redis.Nil {
		return 0
	}
	Expect(err).NotTo(HaveOccurred())
	return n
}

func set(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func values(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// getColumn returns the value of one column of `kubectl get outboxrelays
// <name>`, read at the header's offset (OLDEST may be empty).
func getColumn(name, column string) (string, error) {
	out, err := kubectlErr("-n", namespace, "get", "outboxrelays", name)
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 {
		return "", fmt.Errorf("unexpected output: %q", out)
	}
	i := strings.Index(lines[0], column)
	if i < 0 {
		return "", fmt.Errorf("no column %s in %q", column, lines[0])
	}
	if i >= len(lines[1]) {
		return "", nil
	}
	return strings.Fields(lines[1][i:] + " ")[0], nil
}

func jsonpath(kind, name, path string) (string, error) {
	out, err := kubectlErr("-n", namespace, "get", kind, name, "-o", "jsonpath="+path)
	return strings.TrimSpace(out), err
}

func jsonpathInt(kind, name, path string) (int, error) {
	s, err := jsonpath(kind, name, path)
	if err != nil {
		return -1, err
	}
	if s == "" {
		return 0, nil
	}
	return strconv.Atoi(s)
}

// condition returns status and reason of a condition of an OutboxRelay.
func condition(name, typ string) string {
	c := fmt.Sprintf(`.status.conditions[?(@.type=="%s")]`, typ)
	s, err := jsonpath("outboxrelay", name, "{"+c+".status}/{"+c+".reason}")
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

func conditionMessage(name, typ string) string {
	s, _ := jsonpath("outboxrelay", name, fmt.Sprintf(`{.status.conditions[?(@.type=="%s")].message}`, typ))
	return s
}

// waitRelayPodsGone waits until an OutboxRelay has no relay pod left,
// terminating ones included: a pod relays until its process has stopped.
func waitRelayPodsGone(name string) {
	GinkgoHelper()
	Eventually(func() (string, error) {
		return kubectlErr("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=relay,app.kubernetes.io/instance="+name,
			"-o", "name")
	}).WithTimeout(2*time.Minute).Should(BeEmpty(), "the relay pods of %s, terminating ones included", name)
}

// relayPods lists the relay pods of an OutboxRelay that are not being deleted.
func relayPods(name string) []string {
	out, err := kubectlErr("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=relay,app.kubernetes.io/instance="+name,
		"-o", `go-template={{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{end}}{{end}}`)
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

func readyRelayPods(name string) []string {
	out, err := kubectlErr("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=relay,app.kubernetes.io/instance="+name,
		"-o", `go-template={{range $p := .items}}{{if not $p.metadata.deletionTimestamp}}`+
			`{{range $p.status.conditions}}{{if and (eq .type "Ready") (eq .status "True")}}{{$p.metadata.name}}{{end}}{{end}}`+
			`{{end}} {{end}}`)
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

// patchRelay merge-patches the sample's OutboxRelay.
func patchRelay(patch string) {
	GinkgoHelper()
	kubectl("-n", namespace, "patch", "outboxrelay", relayName, "--type=merge", "-p", patch)
}

// waitRelayReady waits for the Ready condition and the Deployment's rollout.
func waitRelayReady(name string, timeout time.Duration) {
	GinkgoHelper()
	Eventually(func() string { return condition(name, "Ready") }).WithTimeout(timeout).WithPolling(time.Second).
		Should(Equal("True/RelaysReady"))
	kubectl("-n", namespace, "rollout", "status", "deploy/"+name+"-relay", "--timeout=3m")
}

// workerEmailLines counts the worker's log lines that email the order, over
// every worker pod.
func workerEmailLines(orderID string) int {
	out, err := kubectlErr("-n", namespace, "logs", "-l", "app.kubernetes.io/name=worker", "--tail=-1", "--prefix=false")
	if err != nil {
		return -1
	}
	return strings.Count(out, "sending confirmation email for order "+orderID)
}

// streamEntry returns the fields of the first entry of the stream with the
// event id.
func streamEntry(name, eventID string) map[string]any {
	GinkgoHelper()
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, name, start, "+", 2000).Result()
		Expect(err).NotTo(HaveOccurred())
		for _, m := range msgs {
			if m.Values["event_id"] == eventID {
				return m.Values
			}
		}
		if len(msgs) < 2000 {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}
