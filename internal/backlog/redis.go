package backlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/redact"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// DefaultRedisInterval is the least time between two Redis checks of one
// relay: they read settings that rarely change, over a new connection.
const DefaultRedisInterval = time.Minute

// RedisTarget is what one relay's Redis checks look at: the URL and CA from
// its Secrets, and its streams.
type RedisTarget struct {
	// URL is the Redis URL from the relay's Secret.
	URL string
	// CA is the PEM CA from spec.redis.caSecretRef; nil: the system's roots.
	CA []byte
	// Stream and DeadLetterStream are the relay's keys.
	Stream, DeadLetterStream string
}

// fingerprint identifies the target; "" for none.
func (t *RedisTarget) fingerprint() string {
	if t == nil {
		return ""
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%q %q %q %q", t.URL, t.CA, t.Stream, t.DeadLetterStream))
	return "+redis:" + hex.EncodeToString(sum[:])
}

// RedisResult is the outcome of one run of the Redis durability checks.
type RedisResult struct {
	// Checks are doctor.DurabilityChecks, their messages free of the URL
	// and its password.
	Checks doctor.Report
	// CheckedAt is when they finished.
	CheckedAt time.Time
}

// CheckRedis runs the Redis durability checks of `relay doctor` against t
// over a new connection (closed at the end), within ctx. It never returns
// the URL or its password in a message.
func CheckRedis(ctx context.Context, t RedisTarget) doctor.Report {
	var password string
	if u, err := url.Parse(t.URL); err == nil && u.User != nil {
		password, _ = u.User.Password()
	}
	redactAll := func(r doctor.Report) doctor.Report {
		for i := range r {
			r[i].Message = redact.String(r[i].Message, t.URL, password)
			if r[i].Reason == doctor.ReasonUnreachable {
				// No address, no error class: see unreachableMessage.
				r[i].Message = "Redis is unreachable from the operator (no connection could be made; the relays' logs have the details)."
			}
		}
		return r
	}
	deadline := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		deadline = max(time.Until(d), 100*time.Millisecond)
	}
	rdb, _, err := redisconn.New(t.URL, redisconn.Options{
		CA: t.CA, DialTimeout: min(deadline, 5*time.Second), ReadTimeout: deadline, WriteTimeout: deadline, PoolSize: 1,
	})
	if err != nil {
		return redactAll(doctor.Report{{Name: "redis.connection", Status: doctor.Fail, Reason: doctor.ReasonUnreachable,
			Message: "the Redis client could not be built: " + err.Error()}})
	}
	defer func() { _ = rdb.Close() }()
	return redactAll(doctor.DurabilityChecks(doctor.GatherRedis(ctx, rdb, doctor.RedisTarget{Stream: t.Stream})))
}
