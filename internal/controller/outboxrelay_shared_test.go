package controller

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
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
