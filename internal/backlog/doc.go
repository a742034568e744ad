// Package backlog measures the backlog of outbox tables for the operator: the
// count of undispatched rows, the oldest created_at, and apart from them the
// count of rows parked in the dead-letter table, off the reconcile path, so
// that a database that hangs never holds up the reconciles of other
// OutboxRelays.
//
// A [Prober] runs at most one check per relay at a time, keeps the latest
// result per relay, and calls back when a check finishes (the controller
// turns that into a reconcile). A due check waits in a queue, not a
// goroutine, for a dial slot; it gets a connection under a connect deadline
// (shorter until the target has been connected to), then runs its queries
// under a check slot and a deadline; relays whose last check failed get a
// quarter of each kind of slot. The connections belong to a [Measurer]; the
// real one, [PoolMeasurer], keeps a few pgx connections per namespace and
// DSN, shared by the relays that use it, under a bound across every DSN,
// and closes them when the last relay using them is deleted or points at
// another DSN. Tests swap the Measurer for a fake that hangs or fails.
//
// Errors are turned into a [Failure]: a cause the controller maps to a
// condition reason, and a message that never holds the DSN or its password.
package backlog
