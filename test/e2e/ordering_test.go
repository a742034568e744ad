//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

// The ordering scenarios (issue 12): each runs an OutboxRelay of its own, on
// a table and a stream of its own (the sample's Secrets for the
// connections), so the sample's relay and events are never touched; each
// removes what it created.

// orderedTable creates an outbox table of the default layout, with a text
// column aggregate_id when keyed, and the relay's partial index. created_at
// is set by PostgreSQL (DEFAULT now()), as docs/relay.md asks for Strict.
func orderedTable(table string, keyed bool) {
	GinkgoHelper()
	key := ""
	if keyed {
		key = "aggregate_id text NOT NULL,\n"
	}
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+table)
	Expect(err).NotTo(HaveOccurred())
	_, err = db.Exec(ctx, `CREATE TABLE `+table+` (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		`+key+`event_type text NOT NULL,
		payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(),
		dispatched_at timestamptz)`)
	Expect(err).NotTo(HaveOccurred())
	_, err = db.Exec(ctx, `CREATE INDEX `+table+`_pending ON `+table+` (created_at, id) WHERE dispatched_at IS NULL`)
	Expect(err).NotTo(HaveOccurred())
}

// orderedRelay applies an OutboxRelay on the sample's Secrets and registers
// its removal (and that of the table, the stream and its fence hash).
// postgresExtra goes into spec.postgres (e.g. ", columns: {key: aggregate_id}").
func orderedRelay(name, table, stream, postgresExtra, spec string) {
	GinkgoHelper()
	relayWithCleanup(name, table, stream, postgresExtra, "{suspend: true}", spec)
}

// relayWithCleanup is orderedRelay with spec.cleanup given.
func relayWithCleanup(name, table, stream, postgresExtra, cleanup, spec string) {
	GinkgoHelper()
	DeferCleanup(func() {
		_, _ = db.Exec(ctx, `DROP TABLE IF EXISTS `+table)
		_, _ = rdb.Del(ctx, stream, stream+":fence").Result()
	})
	_, err := kubectlIn(fmt.Sprintf(`apiVersion: relay.outbox.dev/v1alpha1
kind: OutboxRelay
metadata: {name: %s}
spec:
  postgres: {dsnSecretRef: {name: orders-db, key: dsn}, table: %s%s}
  redis: {urlSecretRef: {name: orders-redis, key: url}, stream: %s}
  backlog: {checkInterval: 2s}
  cleanup: %s
%s`, name, table, postgresExtra, stream, cleanup, spec),
		"-n", namespace, "apply", "-f", "-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		_, _ = kubectlErr("-n", namespace, "delete", "outboxrelay", name, "--ignore-not-found", "--wait=true", "--timeout=2m")
		waitRelayPodsGone(name)
	})
}

func patchNamed(name, patch string) {
	GinkgoHelper()
	kubectl("-n", namespace, "patch", "outboxrelay", name, "--type=merge", "-p", patch)
}

// produce inserts n rows serially, one per transaction, spread over about
// the given duration: commit order is created_at order. key gives the
// aggregate_id of row i ("" : a table without key). progress counts the
// rows committed.
func produce(table string, n int, over time.Duration, key func(int) string, progress *atomic.Int64) error {
	begin := time.Now()
	for i := 0; i < n; i++ {
		if d := time.Until(begin.Add(over * time.Duration(i) / time.Duration(n))); d > 0 {
			time.Sleep(d)
		}
		payload := fmt.Sprintf(`{"seq":%d}`, i)
		var err error
		if key == nil {
			_, err = db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('e2e_ordered', $1)`, payload)
		} else {
			_, err = db.Exec(ctx, `INSERT INTO `+table+` (aggregate_id, event_type, payload) VALUES ($1, 'e2e_ordered', $2)`, key(i), payload)
		}
		if err != nil {
			return fmt.Errorf("row %d: %w", i, err)
		}
		progress.Add(1)
	}
	return nil
}

// tableRow is one outbox row: its id, key, and the producer's sequence.
type tableRow struct {
	id, key string
	seq     int
}

// rowsInOrder reads every row of the table in (created_at, id) order, the
// order the modes promise.
func rowsInOrder(table string, keyed bool) []tableRow {
	GinkgoHelper()
	key := "''"
	if keyed {
		key = "aggregate_id"
	}
	rows, err := db.Query(ctx, `SELECT id::text, `+key+`, (payload::jsonb->>'seq')::int FROM `+table+` ORDER BY created_at, id`)
	Expect(err).NotTo(HaveOccurred())
	defer rows.Close()
	var out []tableRow
	for rows.Next() {
		var r tableRow
		Expect(rows.Scan(&r.id, &r.key, &r.seq)).To(Succeed())
		out = append(out, r)
	}
	Expect(rows.Err()).NotTo(HaveOccurred())
	return out
}

// entry is one entry of a stream: its event_id and key fields ("key"
// absent: hasKey false).
type entry struct {
	eventID, key string
	hasKey       bool
}

func streamEntries(name string) []entry {
	GinkgoHelper()
	var out []entry
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, name, start, "+", 2000).Result()
		if err == redis.Nil {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		for _, m := range msgs {
			e := entry{}
			e.eventID, _ = m.Values["event_id"].(string)
			e.key, e.hasKey = m.Values["key"].(string)
			out = append(out, e)
		}
		if len(msgs) < 2000 {
			return out
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// orderReport checks the stream against the table's rows: missing events,
// duplicates, and reorderings of first occurrences (what a consumer that
// dedupes on event_id sees): with perKey, within each key; otherwise across
// the whole stream. A reordering is a first occurrence that comes after the
// first occurrence of a later row (of its key).
type orderReport struct {
	events, entries, missing, duplicates, reorders, unknown, wrongKey, noKey int
	firstReorder                                                             string
}

func checkOrder(rows []tableRow, entries []entry, perKey bool) orderReport {
	rank := make(map[string]int, len(rows))
	for i, r := range rows {
		rank[r.id] = i
	}
	rep := orderReport{events: len(rows), entries: len(entries)}
	seen := map[string]bool{}
	last := map[string]int{} // key ("" for Strict) -> rank of the latest first occurrence
	for _, e := range entries {
		i, ok := rank[e.eventID]
		if !ok {
			rep.unknown++
			continue
		}
		r := rows[i]
		if perKey {
			if !e.hasKey {
				rep.noKey++
			} else if e.key != r.key {
				rep.wrongKey++
			}
		}
		if seen[e.eventID] {
			rep.duplicates++
			continue
		}
		seen[e.eventID] = true
		k := ""
		if perKey {
			k = r.key
		}
		if l, ok := last[k]; ok && i < l {
			rep.reorders++
			if rep.firstReorder == "" {
				rep.firstReorder = fmt.Sprintf("row %d (seq %d, key %q) after row %d (seq %d)", i, r.seq, r.key, l, rows[l].seq)
			}
			continue
		}
		last[k] = i
	}
	rep.missing = len(rows) - len(seen)
	return rep
}

func (r orderReport) String() string {
	return fmt.Sprintf("events %d, stream entries %d, missing %d, duplicates %d, reorderings %d, unknown %d, wrong key %d, no key %d",
		r.events, r.entries, r.missing, r.duplicates, r.reorders, r.unknown, r.wrongKey, r.noKey)
}

// ownedPartitions reads, from the relay pods' logs, the last "Key
// partitions owned" line of each pod: the partitions it owns (a standby of
// Strict logs none). Pod by pod, terminating ones included: one pod whose
// container is gone makes `kubectl logs -l` fail as a whole.
func ownedPartitions(name string) map[string][]int64 {
	return ownedPartitionsOf(allRelayPods(name))
}

func ownedPartitionsOf(pods []string) map[string][]int64 {
	owned := map[string][]int64{}
	for _, pod := range pods {
		out, err := kubectlErr("-n", namespace, "logs", pod, "--tail=-1")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, `"Key partitions owned"`) {
				continue
			}
			var rec struct {
				Partitions []int64 `json:"partitions"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil {
				owned[pod] = rec.Partitions
			}
		}
	}
	return owned
}

// allRelayPods lists the relay pods of an OutboxRelay, terminating ones
// included.
func allRelayPods(name string) []string {
	out, err := kubectlErr("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=relay,app.kubernetes.io/instance="+name,
		"-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

// owners lists the pods of the map that own a partition, sorted.
func owners(owned map[string][]int64) []string {
	var ps []string
	for p, parts := range owned {
		if len(parts) > 0 {
			ps = append(ps, p)
		}
	}
	sort.Strings(ps)
	return ps
}

// watchOwners polls the relay pods' logs every second and collects every
// pod seen owning a partition, until the returned stop is called.
func watchOwners(name string) (seen func() []string, stop func()) {
	var mu sync.Mutex
	all := map[string]bool{}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(finished)
		for {
			var unseen []string
			mu.Lock()
			for _, p := range allRelayPods(name) {
				if !all[p] {
					unseen = append(unseen, p)
				}
			}
			mu.Unlock()
			for _, p := range owners(ownedPartitionsOf(unseen)) {
				mu.Lock()
				all[p] = true
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	var once sync.Once
	return func() []string {
			mu.Lock()
			defer mu.Unlock()
			ps := make([]string, 0, len(all))
			for p := range all {
				ps = append(ps, p)
			}
			sort.Strings(ps)
			return ps
		}, func() {
			once.Do(func() { close(done); <-finished })
		}
}

// fenceEpoch is the highest fence of the stream's fence hash (one field per
// table and key partition; the stream is the table's alone).
func fenceEpoch(stream string) int64 {
	vals, err := rdb.HVals(ctx, stream+":fence").Result()
	if err != nil {
		return 0
	}
	var highest int64
	for _, s := range vals {
		n, _ := strconv.ParseInt(s, 10, 64)
		highest = max(highest, n)
	}
	return highest
}

// orderingScenarios are the ordering scenarios of the suite's ordered
// container (issue 12): Strict across a rollout, PerKey during a scale-up.
func orderingScenarios() {
	It("keeps Strict order across a rollout, the standby taking over", func() {
		const (
			name   = "e2e-strict"
			table  = "e2e_strict"
			stream = "e2e-strict"
			n      = 2000
		)
		orderedTable(table, false)
		By("an OutboxRelay with ordering Strict and two replicas: a leader and a warm standby")
		orderedRelay(name, table, stream, "", `  ordering: Strict
  replicas: {min: 2, max: 2}
  relay: {batchSize: 20}
`)
		waitRelayReady(name, 3*time.Minute)
		Eventually(func() []string { return readyRelayPods(name) }).WithTimeout(2 * time.Minute).Should(HaveLen(2))
		Eventually(func() []string { return owners(ownedPartitions(name)) }).WithTimeout(time.Minute).
			WithPolling(time.Second).Should(HaveLen(1), "one leader")
		oldPods := relayPods(name)
		firstLeader := owners(ownedPartitions(name))[0]
		Expect(oldPods).To(ContainElement(firstLeader))
		seen, stopWatch := watchOwners(name)
		DeferCleanup(stopWatch)

		By(fmt.Sprintf("one producer commits %d rows, one per transaction, over 15s", n))
		var produced atomic.Int64
		prodErr := make(chan error, 1)
		start := time.Now()
		go func() {
			defer GinkgoRecover()
			prodErr <- produce(table, n, 15*time.Second, nil, &produced)
		}()
		Eventually(func() int64 { return streamLen(stream) }).WithTimeout(time.Minute).Should(BeNumerically(">=", n/5),
			"the leader publishes")
		epochBefore := fenceEpoch(stream)
		Expect(epochBefore).To(BeNumerically(">", 0))

		By("a rollout mid-drain (relay.batchSize 20 -> 25 changes the pod template)")
		patchNamed(name, `{"spec":{"relay":{"batchSize":25}}}`)
		Eventually(func() (string, error) {
			return jsonpath("deploy", name+"-relay", "{.spec.template.spec.containers[0].args}")
		}).WithTimeout(time.Minute).Should(ContainSubstring("--batch-size=25"))
		kubectl("-n", namespace, "rollout", "status", "deploy/"+name+"-relay", "--timeout=3m")
		// Not deleting: on the local cluster a deleted pod's object lingers
		// for up to 40s after its container exited.
		Eventually(func() []string { return relayPods(name) }).WithTimeout(2*time.Minute).
			Should(SatisfyAll(HaveLen(2), Not(ContainElement(BeElementOf(oldPods)))), "every old pod is deleted")
		rolled := time.Since(start)
		Eventually(prodErr).WithTimeout(2 * time.Minute).Should(Receive(BeNil()))

		By("every event reaches the stream")
		Eventually(func() (int, error) {
			var left int
			err := db.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE dispatched_at IS NULL`).Scan(&left)
			return left, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeZero())
		drained := time.Since(start)
		rows := rowsInOrder(table, false)
		Expect(rows).To(HaveLen(n))
		for i, r := range rows {
			Expect(r.seq).To(Equal(i), "commit order (the producer's sequence) is (created_at, id) order")
		}
		rep := checkOrder(rows, streamEntries(stream), false)
		var finalLeader []string
		Eventually(func() []string {
			finalLeader = owners(ownedPartitionsOf(relayPods(name)))
			return finalLeader
		}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(HaveLen(1), "one leader among the new pods")
		stopWatch()
		// The watcher polls each pod's log once a second, so it can miss a
		// leader that took over between two polls: it reports the handoffs
		// it saw; the assertions below rest on what was read directly.
		leaders := seen()
		// A rollout slower than the production leaves the new leader
		// nothing to publish, and the fence moves with a publish: one row
		// more, after the order checks, which the new leader publishes.
		entries := streamLen(stream)
		_, err := db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('e2e_ordered', '{"seq":-1}')`)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() int64 { return streamLen(stream) }).WithTimeout(time.Minute).Should(BeNumerically(">", entries),
			"the new leader publishes a row written after the rollout")
		epochAfter := fenceEpoch(stream)
		_, _ = fmt.Fprintf(GinkgoWriter,
			"Strict across a rollout: %s; rollout done at %s, drained at %s; leaders seen %v (first %s, now %v); fence epoch %d -> %d\n",
			rep, rolled.Round(time.Millisecond), drained.Round(time.Millisecond), leaders, firstLeader, finalLeader, epochBefore, epochAfter)
		Expect(rep.missing).To(BeZero(), "every event delivered: %s", rep)
		Expect(rep.unknown).To(BeZero(), "%s", rep)
		Expect(rep.reorders).To(BeZero(), "first occurrences in (created_at, id) order: %s; first: %s", rep, rep.firstReorder)

		By("the leadership moved to a new pod, under a new epoch")
		Expect(oldPods).NotTo(ContainElement(finalLeader[0]), "the leader is a pod of the rollout")
		Expect(epochAfter).To(BeNumerically(">", epochBefore), "a new leader published under a newer epoch")
	})

	It("keeps PerKey order while the relays scale from 1 to 3, sharing the key partitions", func() {
		const (
			name   = "e2e-perkey"
			table  = "e2e_perkey"
			stream = "e2e-perkey"
			n      = 3000
			keys   = 100
		)
		orderedTable(table, true)
		By("an OutboxRelay with ordering PerKey on aggregate_id and one relay")
		orderedRelay(name, table, stream, ", columns: {key: aggregate_id}", `  ordering: PerKey
  replicas: {min: 1, max: 1}
  relay: {batchSize: 20}
`)
		waitRelayReady(name, 3*time.Minute)
		Eventually(func() []string { return readyRelayPods(name) }).WithTimeout(2 * time.Minute).Should(HaveLen(1))
		Eventually(func() []int64 {
			for _, parts := range ownedPartitions(name) {
				return parts
			}
			return nil
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(HaveLen(32), "the one relay owns every partition")

		By(fmt.Sprintf("one producer commits %d rows over %d keys, one per transaction, over 15s", n, keys))
		var produced atomic.Int64
		prodErr := make(chan error, 1)
		start := time.Now()
		go func() {
			defer GinkgoRecover()
			// Keys in a scattered order, every key again every 100 rows.
			prodErr <- produce(table, n, 15*time.Second, func(i int) string { return fmt.Sprintf("agg-%02d", (i*37)%keys) }, &produced)
		}()
		Eventually(func() int64 { return streamLen(stream) }).WithTimeout(time.Minute).Should(BeNumerically(">=", n/6),
			"the relay publishes")

		By("scaling to three relays mid-drain (replicas.min = max = 3)")
		patchNamed(name, `{"spec":{"replicas":{"min":3,"max":3}}}`)
		Eventually(func() []string { return readyRelayPods(name) }).WithTimeout(2 * time.Minute).Should(HaveLen(3))
		Eventually(func() string {
			owned := ownedPartitions(name)
			var all []int64
			for _, p := range relayPods(name) {
				if len(owned[p]) == 0 {
					return fmt.Sprintf("%s owns no partition yet: %v", p, owned)
				}
				all = append(all, owned[p]...)
			}
			slices.Sort(all)
			if len(all) != 32 || len(slices.Compact(all)) != 32 {
				return fmt.Sprintf("partitions not yet shared once each: %v", owned)
			}
			return "shared"
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("shared"), "the three relays share the 32 partitions")
		shared := time.Since(start)
		owned := ownedPartitions(name)
		Eventually(prodErr).WithTimeout(2 * time.Minute).Should(Receive(BeNil()))

		By("every event reaches the stream, with its key")
		Eventually(func() (int, error) {
			var left int
			err := db.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE dispatched_at IS NULL`).Scan(&left)
			return left, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeZero())
		drained := time.Since(start)
		rows := rowsInOrder(table, true)
		Expect(rows).To(HaveLen(n))
		rep := checkOrder(rows, streamEntries(stream), true)
		_, _ = fmt.Fprintf(GinkgoWriter, "PerKey 1 -> 3 relays: %s; partitions shared at %s (%v), drained at %s\n",
			rep, shared.Round(time.Millisecond), owned, drained.Round(time.Millisecond))
		Expect(rep.missing).To(BeZero(), "every event delivered: %s", rep)
		Expect(rep.unknown).To(BeZero(), "%s", rep)
		Expect(rep.noKey).To(BeZero(), "every entry carries the field key: %s", rep)
		Expect(rep.wrongKey).To(BeZero(), "the field key is the row's aggregate_id: %s", rep)
		Expect(rep.reorders).To(BeZero(), "per key, first occurrences in (created_at, id) order: %s; first: %s", rep, rep.firstReorder)
	})
}
