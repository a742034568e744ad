package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// Defaults of the stream watch (Config).
const (
	// DefaultStreamCheckInterval is how often the stream is looked at
	// between batches (every batch looks at it too).
	DefaultStreamCheckInterval = 10 * time.Second
	// DefaultAutoReplayMaxWindow bounds an automatic replay: the default
	// retention of cleanup, past which the rows are gone anyway.
	DefaultAutoReplayMaxWindow = 72 * time.Hour
	// clockSkew is the margin between Redis's clock (entry ids) and
	// PostgreSQL's (dispatched_at) that a reset's window allows for.
	clockSkew = time.Minute
)

// streamMetrics are the collectors of the stream watch and the trimming.
type streamMetrics struct {
	Resets            prometheus.Counter
	LastReset         prometheus.Gauge
	LastResetFrom     prometheus.Gauge
	Trimmed           prometheus.Counter
	ReplayedEvents    prometheus.Counter
	resetRecordErrors prometheus.Counter
}

func newStreamMetrics() *streamMetrics {
	return &streamMetrics{
		Resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_stream_resets_total",
			Help: "Times the stream was found to have gone back in time (missing, an older last id, fewer entries ever added): " +
				"entries it held may be lost.",
		}),
		LastReset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_relay_stream_reset_timestamp_seconds",
			Help: "When the last stream reset was detected (Unix time); 0 if never. The end of the window to replay.",
		}),
		LastResetFrom: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_relay_stream_reset_window_start_timestamp_seconds",
			Help: "The earliest dispatch time whose event the last stream reset may have lost (Unix time); 0 if never. " +
				"The start of the window to replay.",
		}),
		Trimmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_stream_trimmed_entries_total",
			Help: "Entries removed from the stream by the relay's trimming (XTRIM MINID), never past what a consumer group has not acknowledged.",
		}),
		ReplayedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_events_replayed_total",
			Help: "Events republished by the relay's automatic replay of a stream reset's window (--auto-replay).",
		}),
		resetRecordErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_stream_reset_record_errors_total",
			Help: "Failed attempts to record a stream reset in the stream-resets table; retried.",
		}),
	}
}

func (m *streamMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Resets, m.LastReset, m.LastResetFrom, m.Trimmed, m.ReplayedEvents, m.resetRecordErrors}
}

// streamGuard is what the relay knows of its stream, to notice when it goes
// back in time: the highest id it saw the stream reach (its own entries'
// ids, or XINFO STREAM's last-generated-id), the stream's count of entries
// ever added (Redis 7), the oldest entry it held and how far every
// consumer group had read and acknowledged. Every batch checks the stream
// in the pipeline of its XADDs (XINFO STREAM first), and the watch loop
// between batches.
type streamGuard struct {
	mu           sync.Mutex
	known        bool     // the relay has seen the stream exist
	lastID       string   // highest id seen
	ownID        string   // the id of the last entry this relay added; "" after a reset
	entriesAdded int64    // a lower bound of entries-added
	firstMs      int64    // ms of the oldest entry at the last good check
	consumedMs   int64    // ms below which every group had read and acked
	groups       []string // the consumer groups at the last good look
	// aheadMs is how far the stream's ids ran ahead of the relay's clock,
	// the most seen (0 if never). Redis makes ids from its own clock and
	// never lets them go back, so a Redis clock ahead, one stepped back
	// after it ran ahead, or an entry added with an explicit later id
	// gives entries ids later than their rows' dispatch; a reset's window
	// reaches back that much further.
	aheadMs    int64
	pending    []outbox.StreamReset
	resetsSeen int
	// savedResets is resetsSeen at the last write of the stream's state
	// (saveStreamState, the watch loop's alone).
	savedResets int
	// checksRefused counts the looks at the stream in a row that Redis
	// refused (streamCheck.refused); refusedWarned is when the last of them
	// was logged at warn level: the first, then at most once a minute.
	checksRefused int
	refusedWarned time.Time
	// found wakes the watch loop when a reset is queued, so that it is
	// recorded at once: until then it lives only in this process.
	found chan struct{}
}

// streamCheck is what a batch asks of the stream before its XADDs: XINFO
// STREAM, and whether the entry the relay added last is still there.
type streamCheck struct {
	info  *redis.XInfoStreamCmd
	own   *redis.XMessageSliceCmd // XRANGE ownID ownID; nil when ownID is ""
	ownID string
	// last is XRANGE lastID lastID, the last entry the relay saw when it is
	// not the relay's own (another relay's, seen through XINFO STREAM, or
	// restored from what the relays recorded); nil otherwise.
	last   *redis.XMessageSliceCmd
	lastID string
}

// queueCheck adds the check to a pipeline, before its XADDs.
func (g *streamGuard) queueCheck(ctx context.Context, pipe redis.Pipeliner, stream string) *streamCheck {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queueCheckLocked(ctx, pipe, stream)
}

func (g *streamGuard) queueCheckLocked(ctx context.Context, pipe redis.Pipeliner, stream string) *streamCheck {
	c := &streamCheck{info: pipe.XInfoStream(ctx, stream), ownID: g.ownID}
	if c.ownID != "" {
		c.own = pipe.XRangeN(ctx, stream, c.ownID, c.ownID, 1)
	}
	if g.known && g.lastID != "" && g.lastID != "0-0" && g.lastID != g.ownID {
		c.lastID = g.lastID
		c.last = pipe.XRangeN(ctx, stream, c.lastID, c.lastID, 1)
	}
	return c
}

// ownEntryLost reports that the entry the relay added last is gone although
// nothing explains it: the stream (of Redis 7 or later, which counts
// deletions) still holds entries at or before it, and deleted none at or
// after it (XDEL), so neither trimming nor a consumer removed it. A
// failover to a replica that had not received it does that, and another
// relay's entries added since can hide it from the other checks: a later
// last id, and as many entries ever added.
func (c *streamCheck) ownEntryLost(x *redis.XInfoStream) bool {
	return entryLost(c.own, c.ownID, x)
}

// lastEntryLost is ownEntryLost for the last entry the relay saw when it
// was not its own: another relay's entry seen through XINFO STREAM, or
// the last id the relays recorded in PostgreSQL (restored at the start).
// A failover to a replica that lacked it, followed by entries of a writer
// that never saw it (a later last id, as many entries ever added), is
// otherwise found by no check: not by this relay, whose own entries
// survived (or which has added none since it started), and not by the
// relay that added it, if it is gone.
func (c *streamCheck) lastEntryLost(x *redis.XInfoStream) bool {
	return entryLost(c.last, c.lastID, x)
}

// entryLost reports that the entry id, which XRANGE cmd (nil: not asked)
// looked for, is gone although the stream (Redis 7 or later) still holds
// entries at or before it and deleted none at or after it.
func entryLost(cmd *redis.XMessageSliceCmd, id string, x *redis.XInfoStream) bool {
	if cmd == nil || cmd.Err() != nil || len(cmd.Val()) > 0 || x.EntriesAdded == 0 || x.FirstEntry.ID == "" {
		return false
	}
	return compareIDs(id, x.FirstEntry.ID) >= 0 && compareIDs(id, x.MaxDeletedEntryID) > 0
}

// refused returns the error reply with which Redis refused the check (an
// ACL without +xinfo|stream or +xrange, a proxy that does not support
// them), nil when it answered or did not answer at all (a network fault,
// which the batch's XADDs show too). A missing stream is an answer.
func (c *streamCheck) refused() error {
	for _, err := range []error{c.info.Err(), c.ownErr(), c.lastErr()} {
		var reply redis.Error
		if err != nil && !redisconn.IsNoSuchKey(err) && errors.As(err, &reply) {
			return err
		}
	}
	return nil
}

func (c *streamCheck) ownErr() error {
	if c.own == nil {
		return nil
	}
	return c.own.Err()
}

func (c *streamCheck) lastErr() error {
	if c.last == nil {
		return nil
	}
	return c.last.Err()
}

// noteRefusedLocked says, at warn level the first time in a row and then at
// most once a minute, that Redis refused a look at the stream, and counts
// each: with the check refused, a stream reset goes unnoticed, so the
// events Redis lost would be lost silently. The caller holds the guard's
// lock.
func (r *Relay) noteRefusedLocked(c *streamCheck) {
	g := &r.stream
	err := c.refused()
	if err == nil {
		if c.info.Err() == nil || redisconn.IsNoSuchKey(c.info.Err()) {
			g.checksRefused = 0
		}
		return
	}
	g.checksRefused++
	r.cfg.Metrics.Errors.WithLabelValues(ErrorKindStreamCheck).Inc()
	level, now := slog.LevelDebug, time.Now()
	if g.checksRefused == 1 || now.Sub(g.refusedWarned) >= time.Minute {
		level, g.refusedWarned = slog.LevelWarn, now
	}
	r.log.Log(context.Background(), level, "Cannot look at the stream: Redis refused XINFO STREAM or XRANGE, "+
		"so a stream reset (entries Redis lost) would go unnoticed and not be replayed; "+
		"grant the relay's user +xinfo|stream and +xrange", "error", err.Error(), "refusedInARow", g.checksRefused)
}

// observeLocked compares what the check (before this batch's XADDs) saw
// with what the relay knew, reports a reset if the stream went back in
// time, and then takes in the new state and the id of the batch's last
// entry (added: "" if none, n entries). The caller holds the guard's lock.
func (r *Relay) observeLocked(c *streamCheck, added string, n int) {
	g := &r.stream
	now := time.Now()
	r.noteRefusedLocked(c)
	g.noteIDLocked(added, now)
	info := c.info
	missing := redisconn.IsNoSuchKey(info.Err())
	if info.Err() != nil && !missing {
		// Redis did not answer: nothing learned. The XADDs' ids still count.
		if added != "" && g.known && compareIDs(added, g.lastID) > 0 {
			g.lastID, g.ownID = added, added
		}
		return
	}
	var x redis.XInfoStream
	if !missing {
		x = *info.Val()
		g.noteIDLocked(x.LastGeneratedID, now)
	}
	if g.known {
		var why string
		switch {
		case missing:
			why = "the stream no longer exists"
		case compareIDs(x.LastGeneratedID, g.lastID) < 0:
			why = fmt.Sprintf("its last id %s is older than %s, the last id the relay saw", x.LastGeneratedID, g.lastID)
		case x.EntriesAdded > 0 && x.EntriesAdded < g.entriesAdded:
			why = fmt.Sprintf("its count of entries ever added fell from %d to %d", g.entriesAdded, x.EntriesAdded)
		case x.EntriesAdded > 0 && x.FirstEntry.ID != "" && compareIDs(x.FirstEntry.ID, g.lastID) > 0 &&
			x.Length > x.EntriesAdded-g.entriesAdded:
			// Every entry is later than the last id the relay saw, and there
			// are more of them than the stream has added since: it was lost
			// and made again by writers that never saw it (a relay started
			// while Redis was down), as many entries or more than it had.
			why = fmt.Sprintf("it holds %d entries, all after %s, the last id the relay saw, but added only %d since: it was made again",
				x.Length, g.lastID, x.EntriesAdded-g.entriesAdded)
		case c.ownID == g.ownID && c.ownEntryLost(&x):
			why = fmt.Sprintf("the entry %s the relay added last is gone, though the stream holds older entries and deleted none since",
				c.ownID)
		case c.lastID == g.lastID && c.lastEntryLost(&x):
			why = fmt.Sprintf("the entry %s, the last the relays saw, is gone, though the stream holds older entries and deleted none since",
				c.lastID)
		}
		if why != "" {
			r.reportReset(why)
			g.consumedMs = 0 // the groups' positions were in the stream that is gone
			g.groups = nil   // and the groups with them: the reset awaits them
			g.ownID = ""     // gone: not reported again
		}
	}
	if missing {
		g.known, g.lastID, g.entriesAdded, g.firstMs, g.consumedMs, g.ownID = false, "", 0, 0, 0, ""
	} else {
		g.known, g.lastID, g.entriesAdded = true, x.LastGeneratedID, x.EntriesAdded
		if x.FirstEntry.ID != "" {
			g.firstMs = idMs(x.FirstEntry.ID)
		} else {
			g.firstMs = idMs(x.LastGeneratedID) // empty: everything before was trimmed or read
		}
	}
	if added != "" {
		g.ownID = added
		if !g.known || compareIDs(added, g.lastID) > 0 {
			g.lastID = added
		}
		if !g.known && g.firstMs == 0 {
			g.firstMs = idMs(added)
		}
		g.known = true
		g.entriesAdded += int64(n)
	}
}

// noteIDLocked takes in a stream id made by Redis before at (by the
// relay's clock): how far ahead of the clock it is, if it is. The caller
// holds the guard's lock.
func (g *streamGuard) noteIDLocked(id string, at time.Time) {
	if ms := idMs(id); ms > 0 {
		g.aheadMs = max(g.aheadMs, ms-at.UnixMilli())
	}
}

// reportReset logs a reset once, counts it and queues its record. The
// window runs from the oldest entry that may not have been consumed (the
// oldest entry the stream held, or every group's acknowledged position if
// later), less the time a batch may take between its claim and its XADD,
// a clock skew and how far the ids ran ahead of the relay's clock, to now.
// The window is of the relay's clock; its record moves it to PostgreSQL's
// (outbox.Table.RecordStreamReset).
func (r *Relay) reportReset(why string) {
	g := &r.stream
	now := time.Now()
	fromMs := max(g.firstMs, g.consumedMs)
	margin := passSlack + time.Duration(r.cfg.InFlight)*r.cfg.PublishTimeout + clockSkew + time.Duration(g.aheadMs)*time.Millisecond
	from := time.Unix(0, 0) // no knowledge: as far back as the table goes
	if fromMs > 0 {
		from = time.UnixMilli(fromMs).Add(-margin)
	}
	reset := outbox.StreamReset{Stream: r.cfg.Stream, WindowStart: from.UTC(), WindowEnd: now.UTC(), Reason: why,
		Groups: slices.Clone(g.groups)}
	g.pending = append(g.pending, reset)
	g.resetsSeen++
	select {
	case g.found <- struct{}{}:
	default: // already signalled (or no watch loop: a nil channel)
	}
	// Logged before it is counted: whoever sees the count finds the line.
	replay := fmt.Sprintf("relay replay --table %s --stream %s --since %s --until %s", r.cfg.Table, r.cfg.Stream,
		reset.WindowStart.Format(time.RFC3339), reset.WindowEnd.Add(time.Second).Format(time.RFC3339))
	if r.cfg.Source == SourceLogicalReplication { // no window of created_at covers it (ReplayWindow)
		replay = fmt.Sprintf("relay replay --table %s --stream %s --pending --source %s", r.cfg.Table, r.cfg.Stream,
			SourceLogicalReplication)
	}
	msg := "Stream reset: entries the relay added may be lost; replay the window"
	if r.cfg.Dispatch == outbox.DeleteOnDispatch {
		// The claim deleted the rows: there is nothing to replay them from.
		msg = "Stream reset: entries the relay added may be lost, and cleanup mode OnDispatch deleted their rows: " +
			"they cannot be replayed (the replay below republishes what is left, and says so)"
	}
	r.log.Error(msg,
		"reason", why, "windowStart", reset.WindowStart.Format(time.RFC3339), "windowEnd", reset.WindowEnd.Format(time.RFC3339),
		"replay", replay)
	m := r.cfg.Metrics.stream
	m.Resets.Inc()
	m.LastReset.Set(float64(now.Unix()))
	m.LastResetFrom.Set(float64(from.Unix()))
}

// checkStream looks at the stream between batches: XINFO STREAM alone,
// under the guard's lock so that no batch's observation interleaves.
func (r *Relay) checkStream(ctx context.Context) {
	g := &r.stream
	g.mu.Lock()
	defer g.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	pipe := r.rdb.Pipeline()
	c := g.queueCheckLocked(ctx, pipe, r.cfg.Stream)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	r.observeLocked(c, "", 0)
}

// lookAtStream is the watch loop's look: how far every consumer group has
// read and acknowledged (where the window of a reset found later begins,
// and which groups that reset takes), then the stream itself (checkStream).
// Two commands, so Redis may lose the stream between them: the groups
// read could be those of a new stream, already past the entries the old
// one lost, and a window begun at them would leave those out. So the
// groups are read first and kept only if no reset was found since, by this
// look at the stream or a batch's.
func (r *Relay) lookAtStream(ctx context.Context) {
	seen := r.stream.seen()
	bound, names, err := groupsBound(ctx, r.rdb, r.cfg.Stream, r.cfg.PublishTimeout)
	r.checkStream(ctx)
	if err == nil {
		r.stream.setGroups(seen, bound, names)
	}
}

// groupsBound is the lowest id some consumer group of stream still needs:
// for each group, its oldest pending entry (delivered, not acknowledged)
// or, with none pending, its last-delivered-id (every entry after it is
// undelivered), and the groups' names. It returns "" and none for a stream
// without groups (or none at all).
func groupsBound(ctx context.Context, rdb redis.UniversalClient, stream string, timeout time.Duration) (string, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if redisconn.IsNoSuchKey(err) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
	}
	bound, names := "", make([]string, 0, len(groups))
	for _, g := range groups {
		names = append(names, g.Name)
		b := g.LastDeliveredID
		if g.Pending > 0 {
			pend, err := rdb.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return "", nil, fmt.Errorf("XPENDING %s %s: %w", stream, g.Name, err)
			}
			if pend.Count > 0 && compareIDs(pend.Lower, b) < 0 {
				b = pend.Lower
			}
		}
		if bound == "" || compareIDs(b, bound) < 0 {
			bound = b
		}
	}
	return bound, names, nil
}

// setGroups records the position below which every consumer group has
// read and acknowledged (a stream id; "" for none), and the groups' names,
// from the watch loop, unless a reset was found since they were read (seen:
// the count of resets then): they may be of the new stream. It is the latest reading, not the highest: a group
// created since at an earlier id, or moved back (XGROUP SETID), has not
// consumed what the others had, and a reset's window must reach back to
// what it still needs. No group at all leaves the names known as they
// are: that is what a reset the relay has not noticed yet looks like, and
// the reset must record the groups it took (a stream whose groups were all
// destroyed on purpose keeps them until a reset records them; the release
// is in docs/relay.md).
func (g *streamGuard) setGroups(seen int, bound string, names []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resetsSeen != seen {
		return
	}
	g.consumedMs = idMs(bound)
	if len(names) > 0 {
		g.groups = names
	}
}

// seen is the count of resets found so far.
func (g *streamGuard) seen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resetsSeen
}

// restore takes in what the relays last saw of the stream (recorded in
// PostgreSQL), when this relay has not seen it yet: so its first look
// finds a reset that happened while no relay ran. ownID stays unknown;
// the entry of the last id restored is looked for (streamCheck.last).
// The last id recorded, seen before its record was written, says how far
// the ids ran ahead of the clock then: the new stream of such a reset
// would not.
func (g *streamGuard) restore(s outbox.StreamState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.noteIDLocked(s.LastID, time.Now().Add(-s.Age))
	if g.known {
		return
	}
	g.known, g.lastID, g.entriesAdded, g.firstMs, g.consumedMs = true, s.LastID, s.EntriesAdded, s.FirstMs, s.ConsumedMs
	if len(g.groups) == 0 {
		g.groups = s.Groups
	}
}

// state is what the relay knows of the stream, for the stream-state table;
// ok is false when it knows nothing (it never saw the stream, or saw it go).
func (g *streamGuard) state(stream string) (s outbox.StreamState, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.known {
		return outbox.StreamState{}, false
	}
	return outbox.StreamState{Stream: stream, LastID: g.lastID, EntriesAdded: g.entriesAdded, FirstMs: g.firstMs,
		ConsumedMs: g.consumedMs, Groups: slices.Clone(g.groups)}, true
}

// loadStreamState restores what the relays last saw of the stream, before
// the first batch looks at it. Without it (no table, no row, or
// PostgreSQL not answering) the relay starts knowing nothing, as before.
// It returns what it restored (the zero value: nothing).
func (r *Relay) loadStreamState(ctx context.Context) outbox.StreamState {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, ok, err := r.cfg.Table.ReadStreamState(ctx, r.db, r.cfg.Stream)
	if err != nil {
		r.log.Warn("Could not read what the relays last saw of the stream; "+
			"a stream reset while no relay ran will not be noticed", "error", err.Error())
		return outbox.StreamState{}
	}
	if ok {
		r.stream.restore(s)
		r.log.Debug("Restored what the relays last saw of the stream", "lastID", s.LastID, "entriesAdded", s.EntriesAdded)
	}
	return s
}

// saveStreamState records what the relay knows of the stream, right after
// a look at it, when that changed since the last save or restore (saved,
// which it updates; the zero value: nothing recorded); a stream seen gone
// (its reset reported) is forgotten, so that a stream made anew is not
// taken for one more reset.
func (r *Relay) saveStreamState(ctx context.Context, saved *outbox.StreamState) {
	if len(r.stream.pendingResets()) > 0 {
		// A reset not recorded yet lives in this process only: what the
		// relays recorded of the stream before it is what lets the next
		// relay find it again, should this one stop before the record.
		return
	}
	s, ok := r.stream.state(r.cfg.Stream)
	if ok && saved != nil && s.LastID == saved.LastID && s.EntriesAdded == saved.EntriesAdded &&
		s.FirstMs == saved.FirstMs && s.ConsumedMs == saved.ConsumedMs && slices.Equal(s.Groups, saved.Groups) {
		return
	}
	if !ok && saved != nil && saved.Stream == "" {
		return // forgotten already
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	seen := r.stream.seen()
	if ok {
		// A reset seen since the last write: this view is of the stream
		// made anew, whose ids may be earlier than those recorded.
		s.Replace = seen != r.stream.savedResets
		err = r.cfg.Table.WriteStreamState(ctx, r.db, s)
		s.Replace = false
	} else {
		err = r.cfg.Table.ForgetStreamState(ctx, r.db, r.cfg.Stream)
	}
	if err != nil {
		r.log.Debug("Could not record what the relay saw of the stream; trying again", "error", err.Error())
		return
	}
	*saved, r.stream.savedResets = s, seen
}

// pendingResets returns a copy of the resets not yet recorded.
func (g *streamGuard) pendingResets() []outbox.StreamReset {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.pending)
}

// takePending returns the resets not yet recorded and forgets them.
func (g *streamGuard) takePending() []outbox.StreamReset {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.pending
	g.pending = nil
	return p
}

// requeue puts back resets that could not be recorded.
func (g *streamGuard) requeue(p []outbox.StreamReset) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending = append(p, g.pending...)
}

// watchStream runs beside the batches until ctx ends: every
// StreamCheckInterval it looks at the stream for a reset, reads the
// consumer groups' positions, trims the stream by the policy (trim.go),
// records the resets found in the stream-resets table and, with
// AutoReplay, replays their windows, and records what it saw of the stream
// (saved: what was restored at the start). At the end it looks once more,
// records and saves: the caller ends ctx after the last batch.
func (r *Relay) watchStream(ctx context.Context, saved outbox.StreamState) {
	resetsTable := false
	tick := time.NewTicker(min(r.cfg.StreamCheckInterval, r.cfg.Trim.Interval))
	defer tick.Stop()
	var lastCheck, lastTrim time.Time
	for {
		now := time.Now()
		if now.Sub(lastCheck) >= r.cfg.StreamCheckInterval {
			lastCheck = now
			r.lookAtStream(ctx)
		}
		if r.cfg.Trim.enabled() && now.Sub(lastTrim) >= r.cfg.Trim.Interval {
			lastTrim = now
			r.trimOnce(ctx)
		}
		if !resetsTable {
			resetsTable = r.ensureStreamResetsTable(ctx)
		}
		r.recordResets(ctx, true)
		if resetsTable && lastCheck.Equal(now) {
			r.saveStreamState(ctx, &saved)
		}
		select {
		case <-ctx.Done():
			final := context.WithoutCancel(ctx)
			r.checkStream(final)
			if !resetsTable { // a relay stopped before its first round made it
				resetsTable = r.ensureStreamResetsTable(final)
			}
			r.recordResets(final, false)
			if resetsTable {
				r.saveStreamState(final, &saved)
			}
			return
		case <-tick.C:
		case <-r.stream.found: // a reset found by a batch: record it now
		}
	}
}

// ensureStreamResetsTable creates the stream-resets table if it is
// missing; a role that may not says so once and the relay runs on (resets
// are still logged and counted).
func (r *Relay) ensureStreamResetsTable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.cfg.Table.EnsureStreamResetsTable(ctx, r.db); err != nil {
		r.log.Warn("Could not create the stream-resets table; "+
			"a stream reset will be logged and counted but not shown by the operator (relay schema --apply)",
			"streamResetsTable", r.cfg.Table.StreamResetsTable(), "error", err.Error())
		return false
	}
	return true
}

// recordResets writes the pending resets to the stream-resets table and,
// with AutoReplay and replay, replays each window; what fails is kept for
// the next round. At shutdown (replay false) it records only: a replay
// waits for the transactions in flight and reads the whole window, longer
// than a pod's grace period; the reset stays pending for a replay by hand
// (the StreamIntact condition and the relay's log ask for it).
func (r *Relay) recordResets(ctx context.Context, replay bool) {
	pending := r.stream.takePending()
	for i, reset := range pending {
		recorded, err := func() (outbox.StreamReset, error) {
			// Not cut short by the relay's shutdown: an INSERT the server
			// committed while the client gave up would be requeued and
			// recorded twice.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			return r.cfg.Table.RecordStreamReset(ctx, r.db, reset, time.Now())
		}()
		if err != nil {
			r.cfg.Metrics.stream.resetRecordErrors.Inc()
			r.log.Warn("Could not record a stream reset, retrying", "error", err.Error())
			r.stream.requeue(pending[i:])
			return
		}
		if recorded.ReachedBack {
			r.log.Error("The stream reset's window reaches back to a replay made since it began, whose events it may have lost too",
				"windowStart", recorded.WindowStart.Format(time.RFC3339))
		}
		switch {
		case r.cfg.AutoReplay && replay:
			r.autoReplay(ctx, recorded)
		case r.cfg.AutoReplay:
			r.log.Warn("Stream reset found at shutdown: recorded, not replayed automatically; replay it by hand",
				"replay", fmt.Sprintf("relay replay --table %s --stream %s --pending", r.cfg.Table, r.cfg.Stream))
		}
	}
}

// autoReplay republishes the rows dispatched in a reset's window, at most
// AutoReplayMaxWindow back, and marks the reset replayed. Source
// LogicalReplication marks no row dispatched: its relay republishes every
// row the table keeps (ReplayWindow), as `relay replay --source
// LogicalReplication --pending` does.
func (r *Relay) autoReplay(ctx context.Context, reset outbox.StreamReset) {
	// A batch may have added its entries to the stream before it was lost
	// and not have committed yet: the replay's read would not see its rows,
	// and the reset would be marked replayed without them. So it waits for
	// this relay's batches in flight, and for every transaction that was
	// running when the reset was recorded (another relay's such batch, which
	// may stop before it finds the reset itself), at most as long as a
	// batch lasts: a batch claimed before the reset was found commits by
	// then or not at all.
	deadline := time.Now().Add(r.batchTimeout() + passSlack)
	r.open.wait(ctx)
	ended, waitErr := waitEndedBelow(ctx, r.cfg.Table, r.db, reset.RunningBelow, deadline)
	if ctx.Err() != nil {
		return // the reset stays pending, for a replay by hand
	}
	// Past the deadline, or on an error, it replays anyway, but marks no
	// reset replayed: a transaction that outlived a batch's deadline on the
	// server (a COMMIT waiting for a synchronous standby, whose client gave
	// up) may be a batch whose entries went with the stream, and whose rows
	// this replay cannot see. The reset stays pending (StreamIntact) for a
	// replay by hand once it has ended.
	keep := ""
	if !ended {
		keep = "transactions running when the stream reset was recorded had not ended after " +
			(r.batchTimeout() + passSlack).String() + " (see pg_stat_activity): a relay's batch among them that commits later " +
			"is not in this replay; the reset stays pending"
		if waitErr != nil {
			keep += " (" + waitErr.Error() + ")"
		}
		r.log.Error("Automatic replay: transactions running when the stream reset was recorded had not ended; "+
			"replaying the window without marking the reset replayed, replay it by hand once they have ended",
			"replay", fmt.Sprintf("relay replay --table %s --stream %s --pending", r.cfg.Table, r.cfg.Stream))
	}
	created := r.cfg.Source == SourceLogicalReplication
	since, until := ReplayWindow(reset.WindowStart, reset.WindowEnd, created)
	markSince := reset.WindowStart
	if !created {
		// A slot relay's replay reads every row kept (ReplayWindow): a
		// row's created_at says nothing of when it was streamed (a
		// catch-up, a partition that joined), and cleanup --slot keeps
		// what a pending reset may need. A polling relay's is bounded.
		since, markSince = r.autoReplayFloor(ctx, reset, since)
	}
	res, err := Replay(ctx, r.cfg.Table, r.db, r.rdb, ReplayOptions{
		Stream: r.cfg.Stream, Since: since, Until: until, Created: created, BatchSize: r.cfg.BatchSize,
		BatchBytes: r.cfg.BatchBytes, PublishTimeout: r.cfg.PublishTimeout, MaxPayloadBytes: r.cfg.MaxPayloadBytes,
		WaitReplicas: r.cfg.WaitReplicas, WaitTimeout: r.cfg.WaitTimeout,
		// The window recorded, not the one a slot's relay reads by
		// created_at, is what is marked; from the floor, a window that
		// began before it is not.
		MarkSince: markSince, KeepResets: keep,
	})
	r.cfg.Metrics.stream.ReplayedEvents.Add(float64(res.Republished))
	if err != nil {
		r.log.Error("Automatic replay of a stream reset failed; replay the window by hand", "error", err.Error(),
			"since", since.Format(time.RFC3339), "until", until.Format(time.RFC3339), "republished", res.Republished)
		return
	}
	r.log.Info("Replayed the window of a stream reset", "since", since.Format(time.RFC3339),
		"until", until.Format(time.RFC3339), "republished", res.Republished, "skipped", res.Skipped)
	if res.Incomplete != "" {
		r.log.Warn("The replayed window may have lost events for good", "reason", res.Incomplete)
	}
}

// autoReplayFloor bounds a polling relay's automatic replay by
// AutoReplayMaxWindow: it returns since, raised to the bound, and where
// the replay marks the reset from. A window that began before the bound
// is replayed from there and stays pending: cleanup keeps the rows of its
// window until a replay by hand covers them. The bound follows cleanup's
// retention, which PostgreSQL's clock judges (dispatched_at, now()): by
// the relay's clock alone, a relay whose clock ran ahead would skip rows
// still in the table and mark their window replayed. The earlier of the
// two clocks rules, so a relay clock behind replays no less either.
func (r *Relay) autoReplayFloor(ctx context.Context, reset outbox.StreamReset, since time.Time) (time.Time, time.Time) {
	now := time.Now()
	if pgNow, err := outbox.Now(ctx, r.db); err == nil && pgNow.Before(now) {
		now = pgNow // on an error, the replay says what fails
	}
	floor := now.Add(-r.cfg.AutoReplayMaxWindow)
	if since.Before(floor) {
		since = floor
	}
	markSince := reset.WindowStart
	if markSince.Before(floor) {
		markSince = floor
		r.log.Error("The stream reset's window began before --auto-replay-max-window: replayed from there only; "+
			"the reset stays pending, replay it by hand",
			"windowStart", reset.WindowStart.Format(time.RFC3339), "replayedSince", floor.Format(time.RFC3339),
			"replay", fmt.Sprintf("relay replay --table %s --stream %s --pending", r.cfg.Table, r.cfg.Stream))
	}
	return since, markSince
}

// ReplayWindow is the window of rows a replay of a stream reset's window
// [start, end] republishes: the rows dispatched from start to end (end
// included, to the second). A relay of source LogicalReplication (created)
// marks no row dispatched, and a row's event reaches the stream any time
// after the row's created_at (the relay's lag, which a catch-up makes
// hours), while a created_at may also lie ahead of the reset (a producer's
// clock ahead, a time the application set; streamed all the same): every
// row, with no bound but what cleanup (`relay cleanup --slot`, by its
// retention) has kept. The rows created after the reset add duplicates.
func ReplayWindow(start, end time.Time, created bool) (since, until time.Time) {
	since, until = start, end.Add(time.Second)
	if created {
		since, until = time.Unix(0, 0).UTC(), noTimeBound
	}
	return since, until
}

// idMs is the millisecond part of a stream id, 0 if it has none.
func idMs(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// parseID splits a stream id "ms-seq"; a bare "ms" has seq 0.
func parseID(id string) (ms, seq uint64) {
	a, b, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseUint(a, 10, 64)
	seq, _ = strconv.ParseUint(b, 10, 64)
	return ms, seq
}

// compareIDs orders two stream ids; "" is the lowest.
func compareIDs(a, b string) int {
	switch {
	case a == b:
		return 0
	case a == "":
		return -1
	case b == "":
		return 1
	}
	am, as := parseID(a)
	bm, bs := parseID(b)
	switch {
	case am < bm || (am == bm && as < bs):
		return -1
	case am == bm && as == bs:
		return 0
	}
	return 1
}

// execObserved runs a batch's pipeline, its XINFO STREAM (check) first,
// and takes in what it saw (added: the id of the last entry it added and how
// many, ok false to learn nothing), under the guard's lock: a stream check
// between the two would move the last id past the batch's own XINFO, and
// the batch would then find the stream gone back in time (a false reset,
// replayed for nothing).
func (r *Relay) execObserved(ctx context.Context, pipe redis.Pipeliner, check *streamCheck,
	added func() (last string, n int, ok bool)) {
	g := &r.stream
	g.mu.Lock()
	defer g.mu.Unlock()
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if last, n, ok := added(); ok {
		r.observeLocked(check, last, n)
	}
}

// lastAdded returns the id of a pipeline's last acknowledged XADD ("" if
// none) and how many were acknowledged.
func lastAdded(cmds []*redis.StringCmd) (string, int) {
	last, n := "", 0
	for _, c := range cmds {
		if c != nil && c.Err() == nil {
			last, n = c.Val(), n+1
		}
	}
	return last, n
}
