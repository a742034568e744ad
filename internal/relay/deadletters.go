package relay

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// RetryOptions configures Retry.
type RetryOptions struct {
	// Filter selects the parked rows to publish again.
	Filter outbox.DeadLetterFilter
	// MaxPayloadBytes is the largest payload published; 0 means
	// DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// PublishTimeout bounds each page's pipeline; 0 means
	// DefaultPublishTimeout.
	PublishTimeout time.Duration
	// BatchBytes bounds the payload bytes read and published per page, as
	// the relay's --batch-bytes bounds a batch: a page ends before the row
	// that would pass it (a larger payload goes alone). Payloads over
	// MaxPayloadBytes are not read at all. 0 means DefaultBatchBytes.
	BatchBytes int
	// MaxLen trims the stream approximately, as the relay does; 0 keeps all.
	MaxLen int64
	// WaitReplicas and WaitTimeout make each page WAIT for replicas before
	// its rows are removed, as the relay does (--wait-replicas): fewer than
	// WaitReplicas acknowledgements within WaitTimeout (default
	// DefaultWaitTimeout) stop the retry and keep the page parked.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// RetryResult is what Retry did.
type RetryResult struct {
	// Republished are the ids of the parked rows added to their stream and
	// removed from the dead-letter table.
	Republished []int64 `json:"republished"`
	// Refused are the rows that still cannot be published; they stay parked
	// with the new reason and one more attempt counted.
	Refused []Refusal `json:"refused"`
}

// Refusal is a parked row that a retry could not publish.
type Refusal struct {
	ID     int64  `json:"id"`
	Reason string `json:"reason"`
}

// retryPage is the number of parked rows handled per transaction, at most.
const retryPage = 100

// Retry publishes parked rows again, each to the stream it was meant for,
// in the order they were parked, a page per transaction: the rows are
// locked, those whose payloads fit in the byte budget read, added to their
// streams in one pipeline (one per stream on a Redis
// Cluster when waiting for replicas), and removed from the dead-letter table
// by the commit that follows the acknowledgements (of WaitReplicas replicas
// too, when set), so a crash or a failover in between republishes (at least
// once) and never loses one. A row
// that still cannot be published (a NULL column, a payload over the limit,
// an entry Redis refuses) stays parked with its new reason; any other Redis
// or PostgreSQL error stops the retry and is returned.
func Retry(ctx context.Context, table *outbox.Table, db *pgxpool.Pool, rdb redis.UniversalClient, o RetryOptions) (RetryResult, error) {
	o.MaxPayloadBytes = cmp.Or(o.MaxPayloadBytes, DefaultMaxPayloadBytes)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, DefaultPublishTimeout)
	o.BatchBytes = cmp.Or(o.BatchBytes, DefaultBatchBytes)
	r := &Relay{cfg: Config{Table: table, MaxPayloadBytes: o.MaxPayloadBytes, PublishTimeout: o.PublishTimeout, MaxLen: o.MaxLen,
		WaitReplicas: o.WaitReplicas, WaitTimeout: cmp.Or(o.WaitTimeout, DefaultWaitTimeout)}}
	res := RetryResult{Republished: []int64{}, Refused: []Refusal{}}
	f := o.Filter
	f.Limit = retryPage
	for {
		var page []outbox.DeadLetter
		more := false
		err := pgtx.Run(ctx, db, func(tx pgx.Tx) error {
			locked, err := table.LockDeadLetters(ctx, tx, f)
			if err != nil || len(locked) == 0 {
				return err
			}
			page = locked[:retryPageFitting(locked, int64(o.MaxPayloadBytes), int64(o.BatchBytes))]
			more = len(locked) == retryPage || len(page) < len(locked)
			if err := table.ReadDeadLetterPayloads(ctx, tx, page, int64(o.MaxPayloadBytes)); err != nil {
				return err
			}
			bulk := r.bulkLimit.get(ctx, rdb)
			reasons, err := r.republish(ctx, rdb, page, bulk)
			if err != nil {
				return err
			}
			for i, d := range page {
				if reasons[i] == "" {
					if err := table.DeleteDeadLetter(ctx, tx, d.ID); err != nil {
						return err
					}
					if err := table.Redispatched(ctx, tx, d.EventID); err != nil {
						return err
					}
					continue
				}
				if err := table.RefuseDeadLetter(ctx, tx, d.ID, reasons[i]); err != nil {
					return err
				}
			}
			if err := tx.Commit(ctx); err != nil {
				return fmt.Errorf("committing retried dead letters: %w", err)
			}
			for i, d := range page {
				if reasons[i] == "" {
					res.Republished = append(res.Republished, d.ID)
				} else {
					res.Refused = append(res.Refused, Refusal{ID: d.ID, Reason: reasons[i]})
				}
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		if !more {
			return res, nil
		}
		f.AfterID = page[len(page)-1].ID
	}
}

// retryPageFitting is how many of the locked rows a retry's page takes: as
// many as there are while the payloads to read (those not over maxPayload)
// add up to at most budget bytes, and at least one.
func retryPageFitting(locked []outbox.DeadLetter, maxPayload, budget int64) int {
	var sum int64
	for i, d := range locked {
		if d.PayloadBytes == nil || *d.PayloadBytes > maxPayload {
			continue // nothing to read
		}
		if sum += *d.PayloadBytes; sum > budget && i > 0 {
			return i
		}
	}
	return len(locked)
}

// republish adds the publishable rows of a page to their streams and
// returns, per row, why it was not published ("" when it was). When the
// relay waits for replicas each pipeline ends with WAIT; on a Redis Cluster
// a page's streams may live on different masters, so each stream gets its
// own pipeline on its master (pipelineFor), and its own WAIT.
func (r *Relay) republish(ctx context.Context, rdb redis.UniversalClient, page []outbox.DeadLetter, bulk int64) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	_, perStream := rdb.(*redis.ClusterClient)
	perStream = perStream && r.cfg.WaitReplicas > 0
	reasons := make([]string, len(page))
	cmds := make([]*redis.StringCmd, len(page))
	var pipes []redis.Pipeliner
	pipeOf := map[string]redis.Pipeliner{} // by stream, or "" for all
	add := map[string]*entries{}           // by stream: a page may hold several
	for i, d := range page {
		over := d.PayloadBytes != nil && *d.PayloadBytes > int64(r.cfg.MaxPayloadBytes)
		if over {
			d.Payload = new(string) // not read: a NULL in another column is still named first
		}
		e, reason := d.Event()
		switch {
		case reason == "" && over:
			reason = r.overPayloadLimit(*d.PayloadBytes)
		case reason == "":
			reason = r.unpublishable(e, bulk)
		}
		if reasons[i] = reason; reason != "" {
			continue
		}
		key := ""
		if perStream {
			key = d.Stream
		}
		pipe := pipeOf[key]
		if pipe == nil {
			var err error
			if pipe, err = r.pipelineFor(ctx, rdb, d.Stream); err != nil {
				return nil, &publishError{err}
			}
			pipeOf[key] = pipe
			pipes = append(pipes, pipe)
		}
		if add[d.Stream] == nil {
			add[d.Stream] = newEntries(d.Stream, r.cfg.MaxLen, len(page))
		}
		if d.Key != nil { // the entry of ordering PerKey carries its key, as the relay's did
			cmds[i] = add[d.Stream].addFields(ctx, pipe, e.ID, e.Type, e.Payload, FieldKey, e.Key)
		} else {
			cmds[i] = add[d.Stream].add(ctx, pipe, e.ID, e.Type, e.Payload, "")
		}
	}
	waits := make([]*redis.Cmd, len(pipes))
	for i, pipe := range pipes {
		waits[i] = r.queueWait(ctx, pipe)
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	for i, cmd := range cmds {
		if cmd == nil || cmd.Err() == nil {
			continue
		}
		if reason, ok := entryRejection(cmd.Err()); ok {
			reasons[i] = reason
			continue
		}
		return nil, &publishError{fmt.Errorf("XADD %s dead letter %d: %w", page[i].Stream, page[i].ID, cmd.Err())}
	}
	for _, wait := range waits {
		if err := r.checkWait(wait); err != nil {
			return nil, err
		}
	}
	return reasons, nil
}

// Discard deletes the parked rows the filter selects and returns their ids.
func Discard(ctx context.Context, table *outbox.Table, db *pgxpool.Pool, filter outbox.DeadLetterFilter) ([]int64, error) {
	ids := []int64{}
	f := filter
	f.Limit = retryPage
	for {
		var page []outbox.DeadLetter
		err := pgtx.Run(ctx, db, func(tx pgx.Tx) error {
			var err error
			if page, err = table.LockDeadLetters(ctx, tx, f); err != nil {
				return err
			}
			for _, d := range page {
				if err := table.DeleteDeadLetter(ctx, tx, d.ID); err != nil {
					return err
				}
			}
			return tx.Commit(ctx)
		})
		if err != nil {
			return ids, err
		}
		for _, d := range page {
			ids = append(ids, d.ID)
		}
		if len(page) < retryPage {
			return ids, nil
		}
		f.AfterID = page[len(page)-1].ID
	}
}
