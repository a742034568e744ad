// Package logical reads the inserts of an outbox table from PostgreSQL's
// logical replication, in commit order.
//
// It is the second source of events of the relay, beside polling: instead of
// claiming pending rows, the relay streams the table's inserts from a
// replication slot through the built-in pgoutput plugin, publishes them, and
// then tells the server how far it got. The server keeps every change past
// that position, so the contract is the relay's usual one, at least once:
//
//	r, err := logical.Open(ctx, cfg, opts)
//	for {
//		b, err := r.Next(ctx, outbox.Rows(500), 20*time.Millisecond) // events in commit order
//		... XADD every event of b, wait for Redis to acknowledge ...
//		err = r.Confirm(ctx, b.Confirm)                 // only now
//	}
//
// A crash anywhere replays what was not confirmed: duplicates, never a loss.
// A transaction is confirmed only once it arrived whole, so one that spans
// batches is replayed from its start.
//
// [Setup] creates what the stream needs on an ordinary connection: a
// publication of the table's inserts and a logical replication slot. The slot
// starts at its creation: rows inserted before are not in the stream, and
// the slot keeps WAL until its position is confirmed, so a relay that stops
// for good must drop it ([DropSlot]); [Status] says how much WAL it keeps.
// The server needs wal_level=logical (a restart to change), and the
// replication connection a role with the REPLICATION attribute.
//
// Two behaviours of the server shape the Reader. A walsender that is asked to
// stop (a fast shutdown) waits until its client has confirmed everything it
// sent: a Reader in Next confirms, when it is caught up, the position of a
// keepalive that asks for a reply (else its caller does, see
// [Reader.IdleEnd]), so an idle relay lets the server stop at once, while one that holds an unconfirmed batch
// delays the shutdown until it confirms, or by up to wal_sender_timeout
// when it does not read. And
// PostgreSQL 15 writes a slot's confirmed position to disk only with other
// changes of the slot, so after a restart of the server the stream may
// resume before what was confirmed: more duplicates, never a loss.
//
// Events of the stream are not marked dispatched in the table: the slot's
// position is the relay's progress. Event.Partition is not set (ordering
// PerKey computes it in SQL); Event.Key is, when the table has a key column.
package logical
