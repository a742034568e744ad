// Package consumer reads a Redis stream of transactional-outbox events with a
// consumer group and runs each event's side effects exactly once against
// PostgreSQL, although the stream delivers at least once.
//
// The stream entry is the one the outbox relay writes:
//
//	XADD <stream> * event_id <id> event_type <type> payload <payload>
//
// # One entry
//
// For each entry the consumer opens a PostgreSQL transaction and first
// inserts the event_id into the processed-events table (default
// processed_events) with ON CONFLICT DO NOTHING. When the row was there
// already, the event was processed before: the consumer commits, acknowledges
// the entry (XACK) and does not run the handler. Otherwise it runs the
// Handler in the same transaction, commits, and only then acknowledges. The
// handler's database writes and the "processed" mark commit together, so a
// redelivered event is a no-op rather than a second email. Side effects
// outside the transaction (an HTTP call, a real email) are at least once:
// make them idempotent or record them in the transaction.
//
// # Failures
//
//   - A handler error rolls the transaction back and leaves the entry
//     pending (not acknowledged). Pending entries idle for longer than
//     MinIdle are reclaimed (XAUTOCLAIM) every ClaimInterval, by this
//     consumer or another one of the group, and run again. Entries left
//     pending by a consumer that died are reclaimed the same way.
//   - An entry whose handler failed on its MaxDeliveries-th delivery, or
//     that was delivered more than MaxDeliveries times without completing
//     (its consumers crashed or timed out in it), or whose handler returned
//     a Permanent error, is added to the dead-letter stream (default
//     <stream>.dead) with the fields event_id, event_type, payload, error,
//     stream_id and deliveries, and then acknowledged: one poison entry never
//     blocks the group. An entry without an event_id is dead-lettered at
//     once.
//   - An entry deleted from the stream before it was acknowledged (trimmed
//     past the groups, XDEL) cannot be delivered again, and XAUTOCLAIM
//     drops it from the pending list: the reclaim pass adds its id to the
//     dead-letter stream (stream_id and error; event_id, event_type,
//     payload and deliveries empty, gone with the entry), and a consumer
//     whose handler failed on an entry no longer in the stream dead-letters
//     it whole instead of leaving it pending.
//   - When PostgreSQL cannot record the event (connection lost, the table
//     missing), the entry is not at fault: the consumer retries it with
//     exponential backoff and reports itself not ready (Ready) meanwhile.
//     Redis errors are retried the same way. A consumer stopped meanwhile
//     leaves the entry pending, and each reclaim counts as a delivery (Redis
//     counts them): after MaxDeliveries restarts during one outage the entry
//     is dead-lettered unhandled.
//
// # Shutdown
//
// Run returns nil once its context is cancelled, after the entries already
// read from Redis (at most BatchSize) are finished: they were delivered to
// this consumer and would otherwise wait MinIdle to be reclaimed. A read
// blocks at most Block, so shutdown takes about Block plus the entries in
// flight.
//
// # Deployment
//
// Every consumer of a group needs its own name: Config.Consumer defaults to
// the environment variable POD_NAME, then the host name, which is the pod's
// name in Kubernetes. The processed-events table dedupes per table, not per
// group: two groups that consume the same stream into the same database each
// need a table of their own. The table grows by one row per event; delete
// rows older than the longest time an event may be redelivered (days) to
// keep it small.
package consumer
