package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Field names of a stream entry (DESIGN.md: the stream entry).
const (
	FieldEventID   = contract.FieldEventID
	FieldEventType = contract.FieldEventType
	FieldPayload   = contract.FieldPayload
	// FieldError is set on dead-letter entries only.
	FieldError = contract.FieldError
	// FieldKey is the row's key, on entries of ordering PerKey only.
	FieldKey = contract.FieldKey
)

// publishError marks a failure on the Redis side of a pass.
type publishError struct{ err error }

func (e *publishError) Error() string { return "publishing batch: " + e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

// parked is an event of the batch that will not be published: it is copied
// to the dead-letter table by the batch's transaction.
type parked struct {
	event  outbox.Event
	reason string
}

// publish adds every publishable event to the stream in one pipeline, in
// order, under the publish deadline, and returns the events to park. It
// returns an error, and the caller rolls the whole batch back, unless every
// entry was either acknowledged or refused for a reason that can only mean
// "this entry is bad" (entryRejections). A refused entry is remembered, so
// that when the refusal also broke the connection (Redis closes it after an
// over-long argument) the retried batch parks it without sending it again.
//
// An ordered relay publishes through its fence instead
// (ownership.publishFenced): all or nothing, in one script, with epoch.
func (r *Relay) publish(ctx context.Context, events []outbox.Event, o *ownership, epoch int64) (published int, dead []parked, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()

	bulkLimit := r.bulkLimit.get(ctx, r.rdb)
	reasons := make([]string, len(events)) // why event i is parked; "" if not
	cmds := make([]*redis.StringCmd, len(events))
	for i, e := range events {
		reasons[i] = r.unpublishable(e, bulkLimit)
	}
	var failed error
	var wait *redis.Cmd // WAIT for replicas (wait.go), nil when not asked
	if o != nil {
		failed = o.publishFenced(ctx, epoch, events, reasons)
	} else {
		pipe, err := r.pipelineFor(ctx, r.rdb, r.cfg.Stream)
		if err != nil {
			return 0, nil, &publishError{err}
		}
		// XINFO STREAM before the XADDs: has the stream gone back in time
		// since the last batch (streamloss.go)?
		check := r.stream.queueCheck(ctx, pipe, r.cfg.Stream)
		add := r.newEntries(r.cfg.Stream, len(events))
		for i, e := range events {
			if reasons[i] == "" {
				cmds[i] = add.add(ctx, pipe, e.ID, e.Type, e.Payload, "")
			}
		}
		wait = r.queueWait(ctx, pipe)
		r.execObserved(ctx, pipe, check, func() (string, int, bool) {
			last, n := lastAdded(cmds)
			return last, n, true
		})
	}
	for i, cmd := range cmds {
		if cmd == nil || cmd.Err() == nil {
			continue
		}
		if reason, ok := entryRejection(cmd.Err()); ok {
			reasons[i] = reason
			r.refused.add(events[i].ID, reason)
			continue
		}
		if failed == nil {
			failed = fmt.Errorf("XADD %s event %s: %w", r.cfg.Stream, events[i].ID, cmd.Err())
		}
	}
	if failed != nil {
		r.bulkLimit.expire() // a lowered limit shows as a reset connection: read it again
		return 0, nil, &publishError{failed}
	}
	if err := r.checkWait(wait); err != nil {
		return 0, nil, err
	}

	pipe, err := r.pipelineFor(ctx, r.rdb, r.cfg.DeadLetterStream)
	if err != nil {
		return 0, nil, &publishError{err}
	}
	var deadEntries *entries
	for i, e := range events {
		if reasons[i] == "" {
			published++
			continue
		}
		if deadEntries == nil {
			deadEntries = r.newEntries(r.cfg.DeadLetterStream, 1)
		}
		dead = append(dead, parked{event: e, reason: reasons[i]})
		payload := e.Payload
		if e.Malformed == "" || r.unpublishable(outbox.Event{Payload: payload}, bulkLimit) != "" {
			// Too big, or refused by Redis (a malformed row's payload too:
			// Redis would close the connection on it, on every retry): the
			// parked copy keeps it.
			payload = ""
		}
		deadEntries.add(ctx, pipe, e.ID, e.Type, payload, reasons[i])
	}
	if pipe.Len() > 0 {
		wait := r.queueWait(ctx, pipe)
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, nil, &publishError{fmt.Errorf("adding to the dead-letter stream %s: %w", r.cfg.DeadLetterStream, err)}
		}
		if err := r.checkWait(wait); err != nil {
			return 0, nil, err
		}
	}
	return published, dead, nil
}

// unpublishable says why an event can never be added to the stream, or "".
// bulkLimit is Redis's proto-max-bulk-len, 0 when unknown.
func (r *Relay) unpublishable(e outbox.Event, bulkLimit int64) string {
	switch {
	case e.Malformed != "":
		return "malformed row: " + e.Malformed
	case len(e.Payload) > r.cfg.MaxPayloadBytes:
		return r.overPayloadLimit(int64(len(e.Payload)))
	case bulkLimit > 0 && int64(len(e.Payload)) > bulkLimit:
		return fmt.Sprintf("rejected by Redis: payload of %d bytes exceeds its proto-max-bulk-len of %d bytes",
			len(e.Payload), bulkLimit)
	}
	return r.refused.get(e.ID)
}

// overPayloadLimit says why a payload of n bytes is not published.
func (r *Relay) overPayloadLimit(n int64) string {
	return fmt.Sprintf("payload of %d bytes exceeds the limit of %d bytes (--max-payload-bytes)", n, r.cfg.MaxPayloadBytes)
}

// bulkLimit caches Redis's proto-max-bulk-len. Redis refuses a longer
// argument by closing the connection, often before the client has read the
// reply, so the relay cannot tell that refusal from a network fault after
// the fact; it checks payloads against the limit before sending instead.
// A server that does not answer CONFIG GET (renamed, or denied by ACL)
// leaves the limit unknown, and such a payload is retried like any fault.
type bulkLimit struct {
	mu      sync.Mutex
	value   int64 // 0: unknown
	checked time.Time
	stale   bool
}

// get returns the limit, reading it on first use and again on the first
// use after expire: a batch retried after a failure sees the limit as it is
// now, so a limit lowered under a running relay costs one failed batch (and
// its duplicates), not one per retry. The failures' backoff bounds how
// often that is.
func (b *bulkLimit) get(ctx context.Context, rdb redis.UniversalClient) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.checked.IsZero() && !b.stale {
		return b.value
	}
	b.checked, b.stale = time.Now(), false
	vals, err := rdb.ConfigGet(ctx, "proto-max-bulk-len").Result()
	if err != nil {
		return b.value
	}
	if n, err := strconv.ParseInt(vals["proto-max-bulk-len"], 10, 64); err == nil && n > 0 {
		b.value = n
	}
	return b.value
}

// expire marks the limit stale: a failed publish may be a lowered limit.
func (b *bulkLimit) expire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stale = true
}

// entryRejectionReplies are the error replies of XADD that can only mean
// "this entry is bad" and will be the same on every retry: an allowlist.
// Every other error (network, timeout, OOM, MISCONF, READONLY, a proxy's
// partial failure, anything new) rolls the batch back to be retried, so a
// good event is never parked because the server had a bad moment.
var entryRejectionReplies = []string{
	// An argument longer than proto-max-bulk-len: the payload. Redis closes
	// the connection after this reply, often before it can be read.
	"ERR Protocol error: invalid bulk length",
	// The same limit, checked by commands that build a string.
	"ERR string exceeds maximum allowed size",
}

// entryRejection reports whether err is an error reply of Redis about this
// one entry, and the reason to record.
func entryRejection(err error) (string, bool) {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return "", false
	}
	for _, p := range entryRejectionReplies {
		if strings.HasPrefix(rerr.Error(), p) {
			return "rejected by Redis: " + rerr.Error(), true
		}
	}
	return "", false
}

// refusals remembers the events Redis refused, by event id, until they are
// parked. It is bounded: when full it forgets everything, and a refused
// event is then simply refused once more.
type refusals struct {
	mu      sync.Mutex
	reasons map[string]string
}

const maxRefusals = 4096

func (f *refusals) add(id, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reasons == nil || len(f.reasons) >= maxRefusals {
		f.reasons = map[string]string{}
	}
	f.reasons[id] = reason
}

func (f *refusals) get(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reasons[id]
}

// forget drops the events that were parked.
func (f *refusals) forget(dead []parked) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range dead {
		delete(f.reasons, d.event.ID)
	}
}

// entries queues the XADDs of a batch to one stream on a pipeline, each
// entry event_id, event_type, payload in that order (and error for dead
// letters), trimmed approximately to maxLen when positive. These are the
// arguments go-redis's XAdd would build from an XAddArgs, without its
// per-entry argument structs: the entries share one argument slice, and the
// stream's name and the MAXLEN are boxed once per batch. What is left per
// event is its three strings boxed, the command and its reply
// (BenchmarkPublish, docs/benchmarks.md).
type entries struct {
	stream any // boxed once
	maxLen any // nil: not trimmed
	args   []any
}

// entryArgs is the number of arguments of the longest entry.
const entryArgs = 14

// newEntries starts the entries of a batch of about n events to stream.
func newEntries(stream string, maxLen int64, n int) *entries {
	q := &entries{stream: stream, args: make([]any, 0, n*entryArgs)}
	if maxLen > 0 {
		q.maxLen = maxLen
	}
	return q
}

// newEntries starts the relay's entries: to its stream, trimmed with
// MaxLen, or to the dead-letter stream, never trimmed.
func (r *Relay) newEntries(stream string, n int) *entries {
	var maxLen int64
	if stream == r.cfg.Stream {
		maxLen = r.cfg.MaxLen
	}
	return newEntries(stream, maxLen, n)
}

// add queues one entry on pipe; reason is set on dead letters only.
func (q *entries) add(ctx context.Context, pipe redis.Pipeliner, id, typ, payload, reason string) *redis.StringCmd {
	if reason == "" {
		return q.addFields(ctx, pipe, id, typ, payload)
	}
	return q.addFields(ctx, pipe, id, typ, payload, FieldError, reason)
}

// addFields queues one entry, with extra fields after the payload (name,
// value pairs): the key of ordering PerKey on a replayed entry, as the
// fenced publish adds it, or a dead letter's error.
func (q *entries) addFields(ctx context.Context, pipe redis.Pipeliner, id, typ, payload string, extra ...string) *redis.StringCmd {
	start := len(q.args)
	q.args = append(q.args, "xadd", q.stream)
	if q.maxLen != nil {
		q.args = append(q.args, "maxlen", "~", q.maxLen)
	}
	q.args = append(q.args, "*", FieldEventID, id, FieldEventType, typ, FieldPayload, payload)
	for _, f := range extra {
		q.args = append(q.args, f)
	}
	// The full slice expression keeps the next entry's appends out of
	// this command's arguments.
	cmd := redis.NewStringCmd(ctx, q.args[start:len(q.args):len(q.args)]...)
	_ = pipe.Process(ctx, cmd) // a pipeline only queues it
	return cmd
}
