package controller

// One OutboxRelay per table (docs/api.md): the relays of two OutboxRelays on
// one table split its rows between their streams, so each event reaches
// only one of them, and nothing else says so. The operator reports the
// relays of a namespace that read one table with one DSN Secret key: both
// are not Ready (reason TableShared) until one of them is deleted. Relays
// that reach one database through different Secrets or namespaces are not
// seen by that: a tenant learns nothing of another namespace. The relays
// themselves register in the table's relays table, whatever their namespace,
// Secret or cluster, and the backlog check reads it (Backlog.OtherRelays):
// relays of other streams or of the other source seen there recently make
// the relay not Ready with the same reason, naming their streams and slots
// (otherRelaysFailure).

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// tableIndex is the field index that maps a table of a database (tableKey)
// to the OutboxRelays that relay it.
const tableIndex = ".spec.postgres.tableKey"

// tableKey names the table a relay reads in the database of its DSN Secret
// key; an unqualified name is the one in schema public.
func tableKey(relay *v1alpha1.OutboxRelay) string {
	ref := relay.Spec.Postgres.DSNSecretRef
	return ref.Name + "/" + ref.Key + "/" + strings.TrimPrefix(relay.Spec.Postgres.GetTable(), "public.")
}

// indexTableKey is the tableIndex function.
func indexTableKey(obj client.Object) []string {
	relay, ok := obj.(*v1alpha1.OutboxRelay)
	if !ok {
		return nil
	}
	return []string{tableKey(relay)}
}

// listTableRelays lists the OutboxRelays of relay's namespace and table,
// relay (by UID) and those being deleted left out.
func (r *OutboxRelayReconciler) listTableRelays(ctx context.Context, relay *v1alpha1.OutboxRelay) ([]v1alpha1.OutboxRelay, error) {
	var list v1alpha1.OutboxRelayList
	if err := r.List(ctx, &list, client.InNamespace(relay.Namespace), client.MatchingFields{tableIndex: tableKey(relay)}); err != nil {
		return nil, fmt.Errorf("listing the OutboxRelays of table %s: %w", relay.Spec.Postgres.GetTable(), err)
	}
	return slices.DeleteFunc(list.Items, func(o v1alpha1.OutboxRelay) bool {
		return o.UID == relay.UID || !o.DeletionTimestamp.IsZero()
	}), nil
}

// tableSharers returns the names, sorted, of the other OutboxRelays of the
// namespace on the relay's table.
func (r *OutboxRelayReconciler) tableSharers(ctx context.Context, relay *v1alpha1.OutboxRelay) ([]string, error) {
	others, err := r.listTableRelays(ctx, relay)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(others))
	for i := range others {
		names = append(names, others[i].Name)
	}
	slices.Sort(names)
	return names, nil
}

// relaysSharingTable maps the creation, spec change or deletion of an
// OutboxRelay to the other relays of its table, whose TableShared state it
// may change.
func (r *OutboxRelayReconciler) relaysSharingTable(ctx context.Context, obj client.Object) []reconcile.Request {
	relay, ok := obj.(*v1alpha1.OutboxRelay)
	if !ok {
		return nil
	}
	others, err := r.listTableRelays(ctx, relay)
	if err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(others))
	for i := range others {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&others[i])})
	}
	return reqs
}

// maxNamedSharers bounds the names a TableShared message quotes.
const maxNamedSharers = 3

// tableSharedFailure is the TableShared failure of a relay that shares its
// table with others, or nil.
func tableSharedFailure(relay *v1alpha1.OutboxRelay, others []string) *failure {
	if len(others) == 0 {
		return nil
	}
	quoted := make([]string, 0, maxNamedSharers+1)
	for _, name := range others[:min(len(others), maxNamedSharers)] {
		quoted = append(quoted, fmt.Sprintf("%q", name))
	}
	if n := len(others) - maxNamedSharers; n > 0 {
		quoted = append(quoted, fmt.Sprintf("%d more", n))
	}
	what := "OutboxRelay " + quoted[0] + " also relays"
	if len(others) > 1 {
		what = "OutboxRelays " + strings.Join(quoted, ", ") + " also relay"
	}
	ref := relay.Spec.Postgres.DSNSecretRef
	return &failure{v1alpha1.ReasonTableShared, fmt.Sprintf(
		"%s table %s with the DSN of Secret %q (key %s): the relays of one table split its rows between their streams, "+
			"so each event reaches only one of them; keep one OutboxRelay per table and delete the others "+
			"(to deliver to two streams, have a consumer copy the events, or write two outboxes)",
		what, relay.Spec.Postgres.GetTable(), ref.Name, ref.Key)}
}

// otherRelaysFailure is the TableShared failure of a relay whose last
// backlog check found, in the table's relays table, relays of other streams
// or of the other source seen within outbox.RelaySeenWindow; nil when none
// (or no check succeeded yet). The relays of this OutboxRelay register with
// its own stream and slot, so they are never among them. The message names
// their streams and slots, never a database.
func otherRelaysFailure(st *relayState) *failure {
	last := st.lastSuccess()
	if last == nil || len(last.Backlog.OtherRelays) == 0 || st.table == nil {
		return nil
	}
	others := last.Backlog.OtherRelays
	named := make([]string, 0, maxNamedSharers+1)
	for _, o := range others[:min(len(others), maxNamedSharers)] {
		named = append(named, o.String())
	}
	if n := len(others) - maxNamedSharers; n > 0 {
		named = append(named, fmt.Sprintf("%d more", n))
	}
	meanwhile := "relay cleanup --slot deletes nothing while one of another stream is registered"
	if !st.relay.Spec.ReadsLogicalReplication() {
		meanwhile = "this OutboxRelay's relays claim nothing meanwhile"
	}
	o := others[0]
	return &failure{v1alpha1.ReasonTableShared, fmt.Sprintf(
		"relays of other streams or sources than this OutboxRelay's also relay table %s (registered in %s, seen within "+
			"the last %s): %s; the relays of one table split its rows between their streams, and a polling relay beside "+
			"a LogicalReplication relay loses rows to the slot's cleanup, so %s. Keep one OutboxRelay per table: stop or "+
			"delete the other relays (of another namespace, Secret or cluster); once one is gone for good, forget it: "+
			"DELETE FROM %s WHERE stream = %s AND slot = %s",
		st.table, st.table.RelaysTable(), outbox.RelaySeenWindow, strings.Join(named, "; "), meanwhile,
		st.table.RelaysTable(), sqlString(o.Stream), sqlString(o.Slot))}
}

// sqlString is s as an SQL string literal, for a statement a person copies.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
