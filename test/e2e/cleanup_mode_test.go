//go:build e2e

package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// cleanupModeScenarios are the scenarios of spec.cleanup.mode (issue 16).
func cleanupModeScenarios() {
	It("deletes each row in the transaction that publishes it (cleanup.mode OnDispatch), with no CronJob", func() {
		const (
			name   = "e2e-ondispatch"
			table  = "e2e_ondispatch"
			stream = "e2e-ondispatch"
			n      = 1000
		)
		orderedTable(table, false)
		By("an OutboxRelay with cleanup.mode OnDispatch")
		relayWithCleanup(name, table, stream, "", "{mode: OnDispatch}", "  relay: {batchSize: 50}\n")
		waitRelayReady(name, 3*time.Minute)
		Expect(jsonpath("deploy", name+"-relay", "{.spec.template.spec.containers[0].args}")).
			To(ContainSubstring("--cleanup-mode=OnDispatch"))
		By("no cleanup CronJob: there are no dispatched rows to delete later")
		Consistently(func() (string, error) {
			return kubectlErr("-n", namespace, "get", "cronjobs", "-l", "app.kubernetes.io/instance="+name,
				"-o", "jsonpath={.items[*].metadata.name}")
		}).WithTimeout(5 * time.Second).WithPolling(time.Second).Should(BeEmpty())

		By(fmt.Sprintf("%d rows committed in 20 transactions", n))
		var ids []string
		for range 20 {
			rows, err := db.Query(ctx, `INSERT INTO `+table+` (event_type, payload)
				SELECT 'e2e_ondispatch', '{"seq":' || g || '}' FROM generate_series(1, $1) g RETURNING id::text`, n/20)
			Expect(err).NotTo(HaveOccurred())
			for rows.Next() {
				var id string
				Expect(rows.Scan(&id)).To(Succeed())
				ids = append(ids, id)
			}
			Expect(rows.Err()).NotTo(HaveOccurred())
		}
		Expect(ids).To(HaveLen(n))

		By("every row reaches the stream and is gone from the table")
		Eventually(func() (int, error) {
			var left int
			err := db.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&left)
			return left, err
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeZero())
		seen := map[string]bool{}
		for _, e := range streamEntries(stream) {
			seen[e.eventID] = true
		}
		missing := 0
		for _, id := range ids {
			if !seen[id] {
				missing++
			}
		}
		Expect(missing).To(BeZero(), "every deleted row was published first")
		Eventually(func() (int, error) { return jsonpathInt("outboxrelay", name, "{.status.backlog}") }).
			WithTimeout(time.Minute).WithPolling(2*time.Second).Should(BeZero(), "the backlog is the rows left")
		Expect(condition(name, "Ready")).To(Equal("True/RelaysReady"))
	})
}
