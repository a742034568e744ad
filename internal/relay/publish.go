package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Field names of a stream entry (DESIGN.md: the stream entry).
const (
	FieldEventID   = "event_id"
	FieldEventType = "event_type"
	FieldPayload   = "payload"
	// FieldError is set on dead-letter entries only.
	FieldError = "error"
)

// publishError marks a failure on the Redis side of a pass.
type publishError struct{ err error }

func (e *publishError) Error() string { return "publishing batch: " + e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }

// publish adds every event to the stream in one pipeline, in order, under
// the publish deadline. Events that can never be published go to the
// dead-letter stream instead. It returns an error if any entry could not be
// added to either stream; the caller then rolls the batch back.
func (r *Relay) publish(ctx context.Context, events []outbox.Event) (published, deadLettered int, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()

	dead := make([]string, len(events)) // why event i is dead-lettered; "" if not
	cmds := make([]*redis.StringCmd, len(events))
	pipe := r.rdb.Pipeline()
	for i, e := range events {
		if dead[i] = r.unpublishable(e); dead[i] != "" {
			continue
		}
		cmds[i] = pipe.XAdd(ctx, r.xaddArgs(r.cfg.Stream, e.ID, e.Type, e.Payload, ""))
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	if err := r.rejections(events, cmds, dead); err != nil {
		return 0, 0, &publishError{err}
	}

	pipe = r.rdb.Pipeline()
	for i, e := range events {
		if dead[i] == "" {
			published++
			continue
		}
		deadLettered++
		payload := e.Payload
		if len(payload) > r.cfg.MaxPayloadBytes {
			payload = "" // the row keeps it; the entry says where to look
		}
		r.log.Error("Dead-lettered an outbox row that cannot be published", "eventID", e.ID,
			"eventType", e.Type, "reason", dead[i], "deadLetterStream", r.cfg.DeadLetterStream)
		pipe.XAdd(ctx, r.xaddArgs(r.cfg.DeadLetterStream, e.ID, e.Type, payload, dead[i]))
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, 0, &publishError{fmt.Errorf("dead-lettering: %w", err)}
		}
	}
	return published, deadLettered, nil
}

// unpublishable says why an event can never be added to the stream, or "".
func (r *Relay) unpublishable(e outbox.Event) string {
	switch {
	case e.Malformed != "":
		return "malformed row: " + e.Malformed
	case len(e.Payload) > r.cfg.MaxPayloadBytes:
		return fmt.Sprintf("payload of %d bytes exceeds the limit of %d bytes; it stays in the outbox table until cleanup",
			len(e.Payload), r.cfg.MaxPayloadBytes)
	}
	return ""
}

// rejections inspects each XADD's reply. An error reply that concerns the
// entry alone marks it for the dead-letter stream; any other failure
// (network, timeout, a fault of the server or the stream key) is returned,
// and the whole batch is retried.
func (r *Relay) rejections(events []outbox.Event, cmds []*redis.StringCmd, dead []string) error {
	var entryErrs int
	var sent int
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		sent++
		err := cmd.Err()
		if err == nil {
			continue
		}
		if !isEntryRejection(err) {
			return fmt.Errorf("XADD %s event %s: %w", r.cfg.Stream, events[i].ID, err)
		}
		entryErrs++
		dead[i] = "rejected by Redis: " + err.Error()
	}
	if entryErrs > 0 && entryErrs == sent {
		// Every entry refused: that is the stream or the server, not the rows.
		for i := range dead {
			if cmds[i] != nil {
				dead[i] = ""
			}
		}
		return fmt.Errorf("XADD %s: every entry of the batch was refused: %w", r.cfg.Stream, cmds[firstSent(cmds)].Err())
	}
	return nil
}

func firstSent(cmds []*redis.StringCmd) int {
	for i, c := range cmds {
		if c != nil {
			return i
		}
	}
	return 0
}

// transientPrefixes are error replies about the server or the key, not the
// entry: retried, never dead-lettered.
var transientPrefixes = []string{
	"OOM", "LOADING", "READONLY", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"MOVED", "ASK", "NOAUTH", "WRONGPASS", "NOPERM", "WRONGTYPE", "EXECABORT", "NOREPLICAS",
}

// isEntryRejection reports whether err is an error reply from Redis about
// this one entry.
func isEntryRejection(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	msg := rerr.Error()
	if strings.HasPrefix(msg, "redis: ") { // client-side errors, e.g. nil reply, pool timeout
		return false
	}
	for _, p := range transientPrefixes {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

// xaddArgs builds one entry: event_id, event_type, payload in that order,
// and error for dead letters.
func (r *Relay) xaddArgs(stream, id, typ, payload, reason string) *redis.XAddArgs {
	values := []any{FieldEventID, id, FieldEventType, typ, FieldPayload, payload}
	if reason != "" {
		values = append(values, FieldError, reason)
	}
	a := &redis.XAddArgs{Stream: stream, Values: values}
	if r.cfg.MaxLen > 0 && stream == r.cfg.Stream {
		a.MaxLen, a.Approx = r.cfg.MaxLen, true
	}
	return a
}
