package outbox

import "time"

// DefaultRescan is how often a Frontier sends a claim back to the start of
// the outbox while it moves ahead.
const DefaultRescan = time.Second

// Frontier is where a claimer's next claim begins (ClaimFrom): past the
// batches it claimed last while the outbox holds more than a batch, from the
// start otherwise. A claim in flight holds its rows locked, and a committed
// batch leaves its index entries behind until vacuum, so a claim from the
// start walks past all of them; one from the frontier does not.
//
// What lies below the frontier and is still pending is a batch in flight
// (its own or another relay's), a row whose transaction committed after the
// claims passed its created_at, or the rows of a batch rolled back. None is
// lost: the claimer resets the frontier when one of its batches fails, a
// short batch (caught up) resets it, and at least every Rescan a claim
// begins at the start again. Such a row waits for that at most.
//
// A Frontier is not safe for concurrent use: one claimer owns it.
type Frontier struct {
	// Rescan bounds how long claims begin past the start; 0: DefaultRescan.
	Rescan time.Duration

	from  time.Time // zero: the start
	since time.Time // when the claims from a point began
}

// Next returns where the next claim begins; ok false: from the start.
func (f *Frontier) Next(now time.Time) (from time.Time, ok bool) {
	rescan := f.Rescan
	if rescan <= 0 {
		rescan = DefaultRescan
	}
	if f.from.IsZero() || now.Sub(f.since) >= rescan {
		f.from = time.Time{}
		return time.Time{}, false
	}
	return f.from, true
}

// Claimed records a claim of at most limit events: a full batch moves the
// frontier to its last created_at (events are in created_at order), fewer
// send the next claim to the start.
func (f *Frontier) Claimed(events []Event, limit int, now time.Time) {
	if len(events) < limit || events[len(events)-1].CreatedAt.IsZero() {
		f.Reset()
		return
	}
	if f.from.IsZero() {
		f.since = now
	}
	f.from = events[len(events)-1].CreatedAt
}

// Reset sends the next claim to the start: after a failure, whose batches'
// rows are pending again below the frontier.
func (f *Frontier) Reset() { f.from = time.Time{} }
