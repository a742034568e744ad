//go:build e2e

package e2e

import (
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// superuser connects to the sample's PostgreSQL as a superuser: on the
// local cluster the server runs on this host and trusts loopback for
// postgres (internal/testenv); config/samples' server (kind, existing)
// makes the sample's own role a superuser (the image's POSTGRES_USER).
func superuser() *pgx.Conn {
	GinkgoHelper()
	dsn := env.pgDSN
	if env.mode == "local" {
		u, err := url.Parse(env.pgDSN)
		Expect(err).NotTo(HaveOccurred())
		u.User, u.Path = url.User("postgres"), "/postgres"
		dsn = u.String()
	}
	conn, err := pgx.Connect(ctx, dsn)
	Expect(err).NotTo(HaveOccurred(), "connecting as a superuser")
	return conn
}

// replicationScenarios are the scenarios of source LogicalReplication
// (issue 16). They need a server with wal_level=logical and a role that may
// replicate: the local cluster's PostgreSQL (hack/demo.sh) runs with
// wal_level=logical and the scenario gives the sample's role REPLICATION;
// config/samples' PostgreSQL (kind, existing) runs with wal_level=logical
// and its role is a superuser.
func replicationScenarios() {
	It("streams a table's inserts from its replication slot in commit order, and drops the slot with the OutboxRelay", func() {
		const (
			name   = "e2e-lr"
			table  = "e2e_lr"
			stream = "e2e-lr"
			n      = 1000
		)
		su := superuser()
		DeferCleanup(func() { _ = su.Close(ctx) })
		var walLevel string
		Expect(su.QueryRow(ctx, `SHOW wal_level`).Scan(&walLevel)).To(Succeed())
		Expect(walLevel).To(Equal("logical"),
			"the sample's PostgreSQL runs with wal_level=logical (internal/testenv, config/samples/postgres.yaml)")
		role := pgx.Identifier{secretValue("orders-db", "username")}.Sanitize()
		By("the sample's role may replicate (ALTER ROLE ... REPLICATION), for this scenario")
		_, err := su.Exec(ctx, `ALTER ROLE `+role+` REPLICATION`)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = su.Exec(ctx, `ALTER ROLE `+role+` NOREPLICATION`) })
		By("max_slot_wal_keep_size set, as docs/operations.md asks")
		_, err = su.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'`)
		Expect(err).NotTo(HaveOccurred())
		_, err = su.Exec(ctx, `SELECT pg_reload_conf()`)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			_, _ = su.Exec(ctx, `ALTER SYSTEM RESET max_slot_wal_keep_size`)
			_, _ = su.Exec(ctx, `SELECT pg_reload_conf()`)
		})

		orderedTable(table, false)
		By("an OutboxRelay with source LogicalReplication")
		relayWithCleanup(name, table, stream, "", "{suspend: true}", "  source: LogicalReplication\n")
		waitRelayReady(name, 3*time.Minute)
		var slot string
		Eventually(func() (string, error) {
			var err error
			slot, err = jsonpath("outboxrelay", name, "{.status.replication.slotName}")
			return slot, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).ShouldNot(BeEmpty())
		slotActive := func() (int, error) {
			var k int
			err := su.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&k)
			return k, err
		}
		Eventually(slotActive).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(1),
			"the relay streams from slot %s", slot)

		Eventually(func() string { return condition(name, "ReplicationSlotHealthy") }).WithTimeout(time.Minute).
			WithPolling(time.Second).Should(Equal("True/SlotHealthy"))

		By(fmt.Sprintf("one producer commits %d rows, one per transaction, over 5s", n))
		var produced atomic.Int64
		Expect(produce(table, n, 5*time.Second, nil, &produced)).To(Succeed())
		Eventually(func() int64 { return streamLen(stream) }).WithTimeout(2 * time.Minute).WithPolling(time.Second).
			Should(BeNumerically(">=", n))
		rows := rowsInOrder(table, false)
		Expect(rows).To(HaveLen(n))
		rep := checkOrder(rows, streamEntries(stream), false)
		_, _ = fmt.Fprintf(GinkgoWriter, "LogicalReplication: %s; ReplicationSlotHealthy %s: %s\n",
			rep, condition(name, "ReplicationSlotHealthy"), conditionMessage(name, "ReplicationSlotHealthy"))
		Expect(rep.missing).To(BeZero(), "every event delivered: %s", rep)
		Expect(rep.unknown).To(BeZero(), "%s", rep)
		Expect(rep.reorders).To(BeZero(), "commit order: %s; first: %s", rep, rep.firstReorder)
		var left int
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE dispatched_at IS NOT NULL`).Scan(&left)).To(Succeed())
		Expect(left).To(BeZero(), "the slot's relay never marks a row")

		By("deleting the OutboxRelay: its finalizer stops the relays and drops the slot")
		kubectl("-n", namespace, "delete", "outboxrelay", name, "--wait=true", "--timeout=2m")
		Eventually(func() (int, error) {
			var k int
			err := su.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&k)
			return k, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeZero(), "slot %s dropped", slot)
	})
}
