package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrorKindRedisReplicas: fewer replicas than WaitReplicas acknowledged a
// batch's entries within WaitTimeout; the batch rolled back.
const ErrorKindRedisReplicas = "redis_replicas"

// DefaultWaitTimeout is how long a batch waits for its replicas by default.
const DefaultWaitTimeout = time.Second

// replicasError says that too few replicas acknowledged a batch.
type replicasError struct {
	acked, want int64
	timeout     time.Duration
}

func (e *replicasError) Error() string {
	return fmt.Sprintf("WAIT: %d of %d replicas acknowledged the batch within %s", e.acked, e.want, e.timeout)
}

// queueWait appends WAIT to a pipeline after its writes, when the relay
// waits for replicas: WAIT counts the replicas that acknowledged every
// write this connection made before it, and a pipeline runs on one
// connection, so it covers exactly the pipeline's entries. It returns nil
// when the relay does not wait.
func (r *Relay) queueWait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	if r.cfg.WaitReplicas <= 0 {
		return nil
	}
	return pipe.Do(ctx, "WAIT", r.cfg.WaitReplicas, r.cfg.WaitTimeout.Milliseconds())
}

// checkWait returns an error unless WAIT (nil: not asked) answered that
// enough replicas acknowledged. The caller rolls the batch back: the
// entries are on the primary but may not survive a failover, so the rows
// stay pending and are published again (a duplicate, never a loss).
func (r *Relay) checkWait(wait *redis.Cmd) error {
	if wait == nil {
		return nil
	}
	acked, err := wait.Int64()
	if err != nil {
		return &publishError{fmt.Errorf("WAIT %d %s: %w", r.cfg.WaitReplicas, r.cfg.WaitTimeout, err)}
	}
	if acked < int64(r.cfg.WaitReplicas) {
		return &publishError{&replicasError{acked: acked, want: int64(r.cfg.WaitReplicas), timeout: r.cfg.WaitTimeout}}
	}
	return nil
}

// kind is the error kind of a failed publish: redis, or redis_replicas.
func (e *publishError) kind() string {
	var re *replicasError
	if errors.As(e.err, &re) {
		return ErrorKindRedisReplicas
	}
	return ErrorKindRedis
}
