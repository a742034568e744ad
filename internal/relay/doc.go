// Package relay moves outbox rows from PostgreSQL into a Redis stream, at
// least once.
//
// One pass (runOnce) claims a batch of pending rows in one statement (FOR
// UPDATE SKIP LOCKED, oldest first, marked dispatched in the same
// transaction), publishes the whole batch to Redis in one pipeline in
// created_at order, and commits only after Redis acknowledged every XADD. On
// any error the transaction rolls back and the rows return to the outbox. A
// crash between the XADDs and the commit republishes the batch: a duplicate,
// never a loss. Several relays take disjoint batches.
//
// Run loops over passes: with no pause after a full batch, otherwise until
// the poll interval passes or a NOTIFY from the table's trigger arrives.
// Faults of PostgreSQL or Redis are retried with capped exponential backoff
// and jitter; the relay never gives up and reports itself not ready until a
// pass succeeds again.
//
// Rows that can never be published are dead-lettered rather than retried
// forever, so one bad row cannot stall the outbox: a row whose id, type or
// payload is NULL, a payload larger than MaxPayloadBytes, or an entry Redis
// rejects with an error reply specific to it. Such a row gets an entry in
// the dead-letter stream (event_id, event_type, error, and the payload when
// it is publishable) and is marked dispatched with the rest of its batch; it
// stays in the table until cleanup's retention expires.
package relay
