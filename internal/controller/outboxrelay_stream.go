package controller

import (
	"fmt"
	"strconv"
	"time"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// streamIntactCondition reports the stream resets that the relays recorded
// in the stream-resets table and no replay has covered yet, read by the
// last backlog check. Unknown while the check has not succeeded.
func streamIntactCondition(st *relayState) condition {
	last := st.lastSuccess()
	if st.backlog != nil && st.backlog.Last != nil && st.backlog.Last.Failure != nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the last backlog check failed")
	}
	if last == nil || last.Backlog.StreamResets == nil {
		return unknownCondition(v1alpha1.ReasonBacklogUnknown, "the stream resets have not been checked yet")
	}
	stream := st.relay.Spec.Redis.GetStream()
	p := last.Backlog.StreamResets
	if p.Count == 0 || p.WindowStart == nil || p.WindowEnd == nil {
		return trueCondition(v1alpha1.ReasonNoStreamReset, "no relay recorded that stream %s lost entries", stream)
	}
	return falseCondition(v1alpha1.ReasonStreamReset, streamResetMessage(stream, st, *p.WindowStart, *p.WindowEnd, p.Count))
}

// streamResetMessage says what was lost, when, and what to run. With
// cleanup mode OnDispatch there is nothing to run: the rows were deleted
// when they were dispatched.
func streamResetMessage(stream string, st *relayState, from, to time.Time, n int64) string {
	cmd := "relay replay --stream=" + stream + " --pending"
	if st.table != nil && st.table.String() != "outbox_events" {
		cmd += " --table=" + st.table.String()
	}
	if st.relay.Spec.Cleanup.DeletesOnDispatch() {
		// Rows dispatched before a switch from AfterRetention are still
		// there (cleanup keeps a reset's window): the replay takes those.
		return fmt.Sprintf("stream %s lost entries (%d resets recorded): events of the rows dispatched from %s to %s may be missing, "+
			"and cleanup mode OnDispatch deleted those rows when it dispatched them, so no replay can republish them; "+
			"tell the consumers, and keep Redis durable (docs/relay.md, \"Cleanup modes\"). Rows dispatched before a switch "+
			"to OnDispatch are still in the table: `%s` republishes those and ends this condition", stream, n,
			from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), cmd)
	}
	if st.relay.Spec.ReadsLogicalReplication() {
		// No row is marked dispatched: the replay selects by created_at.
		cmd += " --source=" + string(v1alpha1.SourceLogicalReplication)
		return fmt.Sprintf("stream %s lost entries (%d resets recorded): events the relays published from %s to %s may be missing; "+
			"republish the rows created before then with `%s` (docs/operations.md)", stream, n,
			from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), cmd)
	}
	return fmt.Sprintf("stream %s lost entries (%d resets recorded): events of the rows dispatched from %s to %s may be missing; "+
		"republish them with `%s` (docs/operations.md)", stream, n,
		from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), cmd)
}

// streamArgs are the relay flags of spec.redis's waitReplicas, trim and
// autoReplay, each only when set, so that relays do not roll when the
// operator is upgraded.
func streamArgs(relay *v1alpha1.OutboxRelay) []string {
	r := &relay.Spec.Redis
	var args []string
	if r.WaitReplicas > 0 {
		args = append(args, "--wait-replicas="+strconv.Itoa(int(r.WaitReplicas)))
		if r.WaitTimeout != nil {
			args = append(args, durationFlag("wait-timeout", r.WaitTimeout.Duration))
		}
	}
	if t := r.Trim; t != nil {
		if t.MaxLen != nil {
			args = append(args, "--trim-max-len="+strconv.FormatInt(*t.MaxLen, 10))
		}
		if t.MaxAge != nil {
			args = append(args, durationFlag("trim-max-age", t.MaxAge.Duration))
		}
		if t.Interval != nil {
			args = append(args, durationFlag("trim-interval", t.Interval.Duration))
		}
	}
	if r.AutoReplay {
		args = append(args, "--auto-replay", durationFlag("auto-replay-max-window", relay.Spec.Cleanup.GetRetention()))
	}
	return args
}
