package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// withDSNOf makes a relay read the DSN (and the Redis URL) from the Secrets
// of the fixture relay named other.
func withDSNOf(other string) relayOption {
	return func(r *v1alpha1.OutboxRelay) {
		r.Spec.Postgres.DSNSecretRef = v1alpha1.SecretKeyReference{Name: other + "-db", Key: "dsn"}
		r.Spec.Redis.URLSecretRef = v1alpha1.SecretKeyReference{Name: other + "-redis", Key: "url"}
	}
}

// TestTableKey: the relays of one table of one database (the same DSN
// Secret key) share a key, whether the table is written with the public
// schema or without; another table, schema or Secret key does not.
func TestTableKey(t *testing.T) {
	t.Parallel()
	key := func(opts ...relayOption) string { return tableKey(newRelay("ns", "orders", opts...)) }
	base := key()
	require.Equal(t, base, key(withTable("outbox_events")))
	require.Equal(t, base, key(withTable("public.outbox_events")))
	require.Equal(t, base, key(withStream("audit")))
	require.NotEqual(t, base, key(withTable("shop.outbox_events")))
	require.NotEqual(t, base, key(withTable("other_events")))
	require.NotEqual(t, base, key(withDSNOf("billing")))
}

// testTwoRelaysOnOneTableAreReported: two OutboxRelays of a namespace on one
// table of one database split its rows between their streams (each event
// reaches only one of them). Both say so (Ready False, TableShared, with a
// Warning Event); once one is deleted the other is Ready again.
func testTwoRelaysOnOneTableAreReported(t *testing.T, s *suite) {
	ctx := context.Background()
	first, _ := s.readyRelay(t, withStream("orders.events"))
	s.markAvailable(t, first)
	s.waitCondition(t, first, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)

	second := newRelay(first.Namespace, "audit", withFastChecks(), withDSNOf(first.Name), withStream("audit.events"))
	s.createRelay(t, second)
	secondKey := client.ObjectKeyFromObject(second)

	got := s.waitCondition(t, secondKey, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonTableShared)
	msg := findCondition(got, v1alpha1.ConditionReady).Message
	require.Contains(t, msg, `OutboxRelay "orders"`)
	require.Contains(t, msg, "outbox_events")
	got = s.waitCondition(t, first, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonTableShared)
	require.Contains(t, findCondition(got, v1alpha1.ConditionReady).Message, `OutboxRelay "audit"`)
	s.waitEvent(t, first, v1alpha1.ReasonTableShared)

	require.NoError(t, s.c.Delete(ctx, s.relay(t, secondKey)))
	s.waitGone(t, secondKey)
	s.waitCondition(t, first, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
}

// TestTableSharedFailure: none without others; the message names them, the
// table and the Secret.
func TestTableSharedFailure(t *testing.T) {
	t.Parallel()
	relay := newRelay("ns", "orders")
	require.Nil(t, tableSharedFailure(relay, nil))
	f := tableSharedFailure(relay, []string{"audit"})
	require.Equal(t, v1alpha1.ReasonTableShared, f.reason)
	require.Contains(t, f.message, `OutboxRelay "audit" also relays table outbox_events with the DSN of Secret "orders-db" (key dsn)`)
	require.Contains(t, tableSharedFailure(relay, []string{"a", "b"}).message, `OutboxRelays "a", "b" also relay table`)
	require.Contains(t, tableSharedFailure(relay, []string{"a", "b", "c", "d", "e"}).message,
		`OutboxRelays "a", "b", "c", 2 more also relay table`)
}

// TestOtherRelaysFailure: relays of other streams or sources found by the
// last successful backlog check in the relays table make Ready False,
// reason TableShared, naming their streams and slots and the DELETE that
// forgets one gone for good; none, or a failed check, make nothing of it.
func TestOtherRelaysFailure(t *testing.T) {
	t.Parallel()
	withOthers := func(others ...outbox.TableRelay) stateOption {
		return func(st *relayState) { st.backlog.Last.Backlog.OtherRelays = others }
	}
	require.Nil(t, otherRelaysFailure(newState()))
	require.Nil(t, otherRelaysFailure(newState(withOthers(outbox.TableRelay{Stream: "audit"}),
		failed(backlog.CauseUnreachable, "down"))), "no successful check: nothing known")

	st := newState(withOthers(outbox.TableRelay{Stream: "audit", Slot: "audit_slot"}, outbox.TableRelay{Stream: "o'brien"}))
	f := otherRelaysFailure(st)
	require.NotNil(t, f)
	require.Equal(t, v1alpha1.ReasonTableShared, f.reason)
	require.Contains(t, f.message, "also relay table outbox_events (registered in outbox_events_relays, seen within the last 30s): "+
		"stream audit (source LogicalReplication, slot audit_slot); stream o'brien (source Polling)")
	require.Contains(t, f.message, "this OutboxRelay's relays claim nothing meanwhile")
	require.Contains(t, f.message, "DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = 'audit_slot'")
	require.NotContains(t, f.message, st.secrets.dsn)

	status := computeStatus(st)
	ready := meta.FindStatusCondition(status.Conditions, string(v1alpha1.ConditionReady))
	require.Equal(t, metav1.ConditionFalse, ready.Status)
	require.Equal(t, string(v1alpha1.ReasonTableShared), ready.Reason)
	require.Equal(t, f.message, ready.Message)

	many := make([]outbox.TableRelay, 0, 5)
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		many = append(many, outbox.TableRelay{Stream: s})
	}
	require.Contains(t, otherRelaysFailure(newState(withOthers(many...))).message,
		"stream a (source Polling); stream b (source Polling); stream c (source Polling); 2 more;")
}

// testRelayOfAnotherStreamInTheDatabaseIsTableShared: a relay of another
// stream registered in the table's relays table (of another namespace,
// Secret or cluster: nothing else of it is known) makes the OutboxRelay not
// Ready, reason TableShared, naming its stream; the row of the
// OutboxRelay's own stream does not count; once the other relay is stopped
// and its row forgotten, the OutboxRelay is Ready again.
func testRelayOfAnotherStreamInTheDatabaseIsTableShared(t *testing.T, s *suite) {
	ctx := context.Background()
	key, conn := s.readyRelay(t, withStream("orders.events"))
	s.markAvailable(t, key)
	table := outbox.MustNew("", outbox.Columns{})
	_, err := table.RecordRelay(ctx, conn, outbox.TableRelay{Stream: "orders.events"}) // this OutboxRelay's relays
	require.NoError(t, err)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)

	// The other relay refreshes its row, as a running one does, until stopped.
	other, err := pgx.Connect(ctx, conn.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, _ = table.RecordRelay(ctx, other, outbox.TableRelay{Stream: "audit.events"})
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	stopOther := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopOther)

	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonTableShared)
	msg := findCondition(got, v1alpha1.ConditionReady).Message
	require.Contains(t, msg, "stream audit.events (source Polling)")
	require.NotContains(t, msg, "stream orders.events")
	require.NotContains(t, msg, conn.Config().ConnString())
	s.waitEvent(t, key, v1alpha1.ReasonTableShared)

	// Gone for good: its row is forgotten, as the message says.
	stopOther()
	_, err = conn.Exec(ctx, `DELETE FROM outbox_events_relays WHERE stream = 'audit.events'`)
	require.NoError(t, err)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
}
