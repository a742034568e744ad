// Package scaling decides how many relays an OutboxRelay runs: the backlog
// divided by the backlog one relay keeps up with, rounded up, between a
// minimum and a maximum; scaling up at once, scaling down only after the
// backlog has asked for fewer relays for a whole stabilisation window; zero
// while suspended.
//
// It is pure: the caller passes the current time and the state it kept from
// the previous decision (the operator keeps it in the OutboxRelay's status,
// so a restart of the manager does not restart a window).
package scaling

import (
	"math"
	"time"
)

// Policy is the scaling part of an OutboxRelay's spec.
type Policy struct {
	// Min is the fewest replicas, at least 0.
	Min int32
	// Max is the most replicas; a Max below Min counts as Min.
	Max int32
	// TargetPerReplica is the backlog one replica keeps up with; values
	// below 1 count as 1.
	TargetPerReplica int64
	// ScaleDownWindow is how long a lower recommendation must last before it
	// is followed.
	ScaleDownWindow time.Duration
}

// bounds returns the policy's range with the documented corrections.
func (p Policy) bounds() (lo, hi int32) {
	lo = max(p.Min, 0)
	return lo, max(p.Max, lo)
}

// Recommend is the replica count the backlog alone calls for:
// ceil(backlog / TargetPerReplica), clamped to [Min, Max].
func (p Policy) Recommend(backlog int64) int32 {
	lo, hi := p.bounds()
	target := max(p.TargetPerReplica, 1)
	backlog = max(backlog, 0)
	n := backlog / target
	if backlog%target != 0 {
		n++
	}
	if n > math.MaxInt32 {
		n = math.MaxInt32
	}
	return clamp(int32(n), lo, hi)
}

func clamp(n, lo, hi int32) int32 { return min(max(n, lo), hi) }

// State is what a decision leaves for the next one.
type State struct {
	// Replicas is the count decided last time; nil when there was none.
	Replicas *int32
	// ScaleDownPendingSince is when the recommendation first fell below
	// Replicas, without rising back since; nil when no scale-down is pending.
	ScaleDownPendingSince *time.Time
}

// Decision is the outcome of Decide.
type Decision struct {
	// Replicas is the count to run now.
	Replicas int32
	// ScaleDownPendingSince is the State to keep for the next decision.
	ScaleDownPendingSince *time.Time
	// RecheckAfter, when positive, is when a pending scale-down falls due:
	// decide again then, even if nothing else happens.
	RecheckAfter time.Duration
}

// Decide returns the replica count to run now.
//
//   - suspended: 0.
//   - backlog unknown (nil): the previous count, clamped to [Min, Max] (Min
//     when there was none), and at least 1: a failed measurement never
//     scales down, and a relay with Min 0 whose backlog cannot be measured
//     still runs one relay rather than none, since rows may be waiting.
//   - a recommendation at or above the previous count (clamped to the
//     bounds, so a changed spec applies at once) is followed at once.
//   - a lower one is followed once lower recommendations have lasted
//     ScaleDownWindow since ScaleDownPendingSince; until then the count stays.
func Decide(p Policy, suspended bool, backlog *int64, prev State, now time.Time) Decision {
	if suspended {
		return Decision{Replicas: 0}
	}
	lo, hi := p.bounds()
	if backlog == nil {
		current := lo
		if prev.Replicas != nil {
			current = clamp(*prev.Replicas, lo, hi)
		}
		return Decision{Replicas: clamp(max(current, 1), lo, hi)}
	}
	if prev.Replicas == nil {
		return Decision{Replicas: p.Recommend(*backlog)}
	}
	current := clamp(*prev.Replicas, lo, hi)
	want := p.Recommend(*backlog)
	if want >= current {
		return Decision{Replicas: want}
	}
	since := now
	if prev.ScaleDownPendingSince != nil && !prev.ScaleDownPendingSince.After(now) {
		since = *prev.ScaleDownPendingSince
	}
	elapsed := now.Sub(since)
	if elapsed >= p.ScaleDownWindow {
		return Decision{Replicas: want}
	}
	return Decision{Replicas: current, ScaleDownPendingSince: &since, RecheckAfter: p.ScaleDownWindow - elapsed}
}
