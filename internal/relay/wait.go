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
// write this connection made before it, and a pipeline from r.pipelineFor runs
// on one connection, so it covers exactly the pipeline's entries. It returns
// nil when the relay does not wait.
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

// pipelineFor returns the pipeline for a batch of writes to key, which
// queueWait may end with WAIT. WAIT counts the replicas that acknowledged
// the writes of its own connection, so the writes and WAIT must share one
// connection to the master that holds key. The pipeline of a client of one
// server, or of the sentinels' failover client, runs on one connection. A
// ClusterClient's does not: it splits a pipeline by node and sends the
// keyless WAIT to any master (round robin, or the slot of its argument
// while its command table is not loaded), where it answers at once with
// that master's replica count, acknowledging nothing of the batch.
//
// So on a Redis Cluster, when the relay waits for replicas, the pipeline is
// the one of the node client of the master that holds key's slot
// (ClusterClient.MasterForKey): every command on one connection of that
// master. It follows no redirect: a MOVED or ASK reply (the slot moved or is
// moving), CLUSTERDOWN, TRYAGAIN, READONLY (the master became a replica) or
// a connection error fails the batch, which rolls back and is retried with
// backoff, and makes the cluster client reload its slots (ReloadState) so
// that the retry goes to the slot's new master.
func (r *Relay) pipelineFor(ctx context.Context, rdb redis.UniversalClient, key string) (redis.Pipeliner, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok || r.cfg.WaitReplicas <= 0 {
		return rdb.Pipeline(), nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		cc.ReloadState(ctx)
		return nil, fmt.Errorf("finding the cluster master of %s: %w", key, err)
	}
	return &masterPipeline{Pipeliner: node.Pipeline(), cluster: cc}, nil
}

// masterPipeline is the pipeline of one cluster master's node client; it
// has the cluster client reload its slots after a reply that says the
// routing is stale.
type masterPipeline struct {
	redis.Pipeliner
	cluster *redis.ClusterClient
}

// Exec runs the pipeline on one connection of the master.
func (p *masterPipeline) Exec(ctx context.Context) ([]redis.Cmder, error) {
	cmds, err := p.Pipeliner.Exec(ctx)
	if err == nil {
		return cmds, nil
	}
	for _, cmd := range cmds {
		if staleRouting(cmd.Err()) {
			p.cluster.ReloadState(ctx)
			break
		}
	}
	return cmds, err
}

// staleRouting reports an error after which the cluster's slots should be
// read again: a redirect, a cluster or master not (yet) serving the slot,
// or anything that is not a reply of Redis (a connection error, a timeout).
func staleRouting(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	if redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsReadOnlyError(err) {
		return true
	}
	var reply redis.Error
	return !errors.As(err, &reply)
}
