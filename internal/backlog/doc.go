// Package backlog measures the backlog of outbox tables for the operator: the
// count of undispatched rows, the oldest created_at, and apart from them the
// count of rows parked in the dead-letter table, off the reconcile path, so
// that a database that hangs never holds up the reconciles of other
// OutboxRelays.
//
// A [Prober] runs at most one check per relay at a time, each in its own
// goroutine under a deadline, keeps the latest result per relay, and calls
// back when a check finishes (the controller turns that into a reconcile).
// The connections belong to a [Measurer]; the real one, [PoolMeasurer], keeps
// one small pgx pool per namespace and DSN, shared by the relays that use it,
// and closes a pool when the last relay using it is deleted or points at
// another DSN. Tests swap the Measurer for a fake that hangs or fails.
//
// Errors are turned into a [Failure]: a cause the controller maps to a
// condition reason, and a message that never holds the DSN or its password.
package backlog
