// Package doctor holds the preflight checks of `relay doctor`: whether the
// outbox table, the role and the Redis server can keep the relay's promise.
//
// Each check is a pure function of facts gathered beforehand (the table's
// columns from the catalog, the parsed CONFIG GET and INFO replies of Redis),
// table-tested on plain inputs; the gathering (GatherRedis, GatherPostgres)
// is the only part that talks to a server. The same Redis durability checks
// run in three places: `relay doctor`, `relay run` (at start and every
// --redis-check-interval, as a warning in the log and the gauge
// outbox_relay_redis_check), and the operator (the condition RedisDurable).
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is the verdict of one check.
type Status string

// The verdicts, from best to worst. Only Fail makes `relay doctor` exit
// non-zero.
const (
	// OK: nothing to do.
	OK Status = "ok"
	// Info: worth knowing, nothing is at risk (e.g. no NOTIFY trigger).
	Info Status = "info"
	// Warn: a risk a person should weigh, or a check that could not be
	// made (Reason RedisCheckUnknown) with how to make it by hand.
	Warn Status = "warn"
	// Fail: the relay cannot work, or acknowledged events can be lost.
	Fail Status = "fail"
)

// rank orders statuses by severity.
func (s Status) rank() int {
	switch s {
	case Info:
		return 1
	case Warn:
		return 2
	case Fail:
		return 3
	}
	return 0
}

// Reasons name the cause of a Redis check's verdict. The operator's
// condition RedisDurable uses the same strings (api/v1alpha1).
const (
	ReasonDurable            = "RedisDurable"
	ReasonEvictionUnsafe     = "RedisEvictionUnsafe"
	ReasonPersistenceOff     = "RedisPersistenceOff"
	ReasonPersistenceWeak    = "RedisPersistenceWeak"
	ReasonFsyncLax           = "RedisFsyncLax"
	ReasonCheckUnknown       = "RedisCheckUnknown"
	ReasonUnreachable        = "RedisUnreachable"
	ReasonAuthFailed         = "RedisAuthFailed"
	ReasonReadOnlyReplica    = "RedisReadOnlyReplica"
	ReasonWrongType          = "RedisWrongType"
	ReasonNoReplica          = "RedisNoReplica"
	ReasonReplicasAttached   = "RedisReplicasAttached"
	ReasonPersistent         = "RedisPersistent"
	ReasonEvictionSafe       = "RedisEvictionSafe"
	ReasonReachable          = "RedisReachable"
	ReasonStreamUsable       = "RedisStreamUsable"
	ReasonNoConsumerGroup    = "RedisNoConsumerGroup"
	ReasonConsumerGroupsSeen = "RedisConsumerGroups"
	ReasonStreamCheckRefused = "RedisStreamCheckRefused"
)

// Check is one line of the report.
type Check struct {
	// Name identifies the check, e.g. "redis.eviction" or "outbox.index".
	Name string `json:"name"`
	// Status is the verdict.
	Status Status `json:"status"`
	// Reason is a machine-readable cause (Redis checks), e.g.
	// RedisEvictionUnsafe.
	Reason string `json:"reason,omitempty"`
	// Message says what was found.
	Message string `json:"message"`
	// Fix says what to do; empty when nothing is to be done.
	Fix string `json:"fix,omitempty"`
}

// Report is the outcome of every check, in the order they ran.
type Report []Check

// Failed reports whether a check failed.
func (r Report) Failed() bool {
	for _, c := range r {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Worst returns the first of the worst checks, or a zero Check when r is
// empty.
func (r Report) Worst() Check {
	var w Check
	for _, c := range r {
		if w.Name == "" || c.Status.rank() > w.Status.rank() {
			w = c
		}
	}
	return w
}

// WriteText writes one line per check: status, name, message and fix.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range r {
		line := c.Message
		if c.Fix != "" {
			line += " Fix: " + c.Fix
		}
		line = strings.ReplaceAll(line, "\n", " ")
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, line); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// WriteJSON writes {"ok": bool, "checks": [...]}; ok is false when a check
// failed.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	checks := r
	if checks == nil {
		checks = Report{}
	}
	return enc.Encode(struct {
		OK     bool   `json:"ok"`
		Checks Report `json:"checks"`
	}{!r.Failed(), checks})
}
