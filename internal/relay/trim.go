package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultTrimInterval is how often the relay trims its stream.
const DefaultTrimInterval = time.Minute

// trimPage bounds the entries one round of length trimming looks at (and
// removes): a stream far over its length is brought down over a few
// rounds, each a bounded XRANGE.
const trimPage = 10000

// TrimPolicy is how the relay trims its stream. An entry is removed when it
// is beyond MaxLen (the oldest first) or older than MaxAge, whichever
// removes more, and never when a consumer group of the stream has not yet
// been delivered it, or has it pending (delivered, not acknowledged). A
// stream without groups is not trimmed (ErrNoConsumerGroup). Zero MaxLen
// and MaxAge: no trimming.
type TrimPolicy struct {
	// MaxLen keeps at most about this many entries; 0: no length bound.
	MaxLen int64
	// MaxAge removes entries older than this (by their id's time, Redis's
	// clock); 0: no age bound.
	MaxAge time.Duration
	// Interval is the time between two trims; default DefaultTrimInterval.
	Interval time.Duration
}

func (p TrimPolicy) enabled() bool { return p.MaxLen > 0 || p.MaxAge > 0 }

func (p TrimPolicy) withDefaults() TrimPolicy {
	if p.Interval == 0 {
		p.Interval = DefaultTrimInterval
	}
	return p
}

func (p TrimPolicy) validate() error {
	var errs []error
	if p.MaxLen < 0 {
		errs = append(errs, fmt.Errorf("trim max len %d is negative", p.MaxLen))
	}
	if p.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("trim max age %s is negative", p.MaxAge))
	}
	if p.Interval < time.Millisecond {
		errs = append(errs, fmt.Errorf("trim interval %s below 1ms", p.Interval))
	}
	return errors.Join(errs...)
}

// GroupsAwaitedError is Trim leaving alone a stream that lacks some of the
// consumer groups a stream reset took with it (outbox.Table.AwaitedGroups):
// the groups that are back say nothing of what the others still have to
// read, which their consumers read again from 0 (or from where they keep
// their position) once they create them again.
type GroupsAwaitedError struct {
	Missing []string
}

func (e *GroupsAwaitedError) Error() string {
	return fmt.Sprintf("the consumer groups %s, which a stream reset took, are not back: not trimmed", strings.Join(e.Missing, ", "))
}

// ErrNoConsumerGroup is Trim leaving alone a stream that has no consumer
// group: nothing says what its consumers have read. A stream reset takes
// the groups with the stream (they live in its key), and the replay and the
// backlog then land in a stream without groups until the consumers create
// theirs again at "0": trimmed by the policy alone meanwhile, those entries
// would be gone before any consumer read them.
var ErrNoConsumerGroup = errors.New("the stream has no consumer group: not trimmed")

// trimOnce trims the stream once and counts what it removed; a failure is
// logged at warn level the first time and every tenth in a row, else at
// debug level (the batches report Redis's faults), a stream left alone for
// want of a group once at info level. It waits for the groups
// that stream resets took (recorded in the stream-resets table, or still
// to be recorded), and records them back once all are.
func (r *Relay) trimOnce(ctx context.Context) {
	awaited, resets, err := r.awaitedGroups(ctx)
	if err != nil {
		r.log.Debug("Not trimming the stream: could not read the groups stream resets took", "error", err.Error())
		return
	}
	n, bound, err := Trim(ctx, r.rdb, r.cfg.Stream, r.cfg.Trim, r.cfg.PublishTimeout, awaited...)
	var held *GroupsAwaitedError
	switch {
	case errors.Is(err, ErrNoConsumerGroup):
		r.holdTrim("Not trimming the stream: it has no consumer group, and a group created later at 0 must find every entry")
		return
	case errors.As(err, &held):
		r.holdTrim("Not trimming the stream until the consumer groups a stream reset took are back: "+
			"they read the replayed entries and the backlog from where their consumers create them again",
			"missing", held.Missing, "release", fmt.Sprintf("UPDATE %s SET groups_back_at = now() WHERE stream = '%s' "+
				"AND groups_back_at IS NULL (for groups that will not come back)", r.cfg.Table.StreamResetsTable(),
				strings.ReplaceAll(r.cfg.Stream, "'", "''")))
		return
	}
	r.trimHeld = ""
	if err != nil {
		// Redis's faults show in the batches too; a trim that keeps failing
		// (an ACL without the script) lets the stream grow without bound.
		r.trimFailures++
		level := slog.LevelDebug
		if r.trimFailures%10 == 1 {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, "Trimming the stream failed, retrying at the next interval", "error", err.Error(),
			"failuresInARow", r.trimFailures)
		return
	}
	r.trimFailures = 0
	if len(resets) > 0 {
		// Every group awaited is back: trimming no longer waits for them.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := r.cfg.Table.GroupsBack(ctx, r.db, resets); err != nil {
			r.log.Debug("Could not record the groups back; asking again next time", "error", err.Error())
		}
	}
	if n > 0 {
		r.cfg.Metrics.stream.Trimmed.Add(float64(n))
		r.log.Debug("Trimmed the stream", "entries", n, "minID", bound)
	}
}

// holdTrim says once, at info level, why the stream is not trimmed.
func (r *Relay) holdTrim(why string, args ...any) {
	if r.trimHeld != why {
		r.trimHeld = why
		r.log.Info(why, args...)
	}
}

// awaitedGroups are the groups that stream resets took and that were not
// seen back (the stream-resets table's, and those of resets not recorded
// yet), and the recorded resets they come from.
func (r *Relay) awaitedGroups(ctx context.Context) ([]string, []int64, error) {
	var groups []string
	for _, reset := range r.stream.pendingResets() {
		groups = append(groups, reset.Groups...)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	recorded, resets, err := r.cfg.Table.AwaitedGroups(ctx, r.db, r.cfg.Stream)
	if err != nil {
		return nil, nil, err
	}
	for _, g := range recorded {
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	return groups, resets, nil
}

// Trim removes the entries of stream that the policy allows and every
// consumer group is done with: it computes the policy's bound (an id), and
// one script (trimScript) computes the groups' bound (the lowest of each
// group's last-delivered-id and oldest pending entry) and runs XTRIM MINID
// with the lower of the two. It returns the entries removed and the bound.
//
// A stream without groups is not trimmed: ErrNoConsumerGroup; nor one
// that lacks a group of awaited: GroupsAwaitedError. The groups are read
// in the script that trims, so no group created meanwhile (at "0", say)
// and no stream made again since the policy's bound was read (a reset: its
// entries may have ids below that bound) can lose an entry to the trim.
func Trim(ctx context.Context, rdb redis.UniversalClient, stream string, p TrimPolicy, timeout time.Duration,
	awaited ...string) (int64, string, error) {
	if !p.enabled() {
		return 0, "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bound, err := policyBound(ctx, rdb, stream, p)
	if err != nil || bound == "" {
		return 0, "", err
	}
	res, err := trimScript.Run(ctx, rdb, []string{stream}, append([]any{bound}, toAny(awaited)...)...).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("trim %s to MINID %s: %w", stream, bound, err)
	}
	if len(res) < 3 {
		return 0, "", fmt.Errorf("trim %s: unexpected reply %v", stream, res)
	}
	n, _ := res[0].(int64)
	bound, _ = res[1].(string)
	switch status, _ := res[2].(string); status {
	case "":
		return n, bound, nil
	case "no groups":
		return 0, "", ErrNoConsumerGroup
	case "missing":
		missing := make([]string, 0, len(res)-3)
		for _, m := range res[3:] {
			name, _ := m.(string)
			missing = append(missing, name)
		}
		return 0, "", &GroupsAwaitedError{Missing: missing}
	default:
		return 0, "", fmt.Errorf("trim %s: unexpected status %q", stream, status)
	}
}

// trimScript trims KEYS[1] to the lower of ARGV[1] (the policy's bound)
// and its consumer groups' bound, read in the script (as groupsBound reads
// it). ARGV[2:] are the groups awaited. It returns {removed, bound,
// status, missing groups...}: status "" (trimmed), "no groups" (none, or
// no stream) or "missing" (awaited groups absent: their names follow); any
// other error of XINFO GROUPS (an ACL without it) is the script's error.
// Ids are compared as two decimal numbers, by length, then as text.
var trimScript = redis.NewScript(`
local function numLess(a, b) return #a < #b or (#a == #b and a < b) end
local function idLess(a, b)
	local am, as = string.match(a, '^(%d+)-(%d+)$')
	local bm, bs = string.match(b, '^(%d+)-(%d+)$')
	return numLess(am, bm) or (am == bm and numLess(as, bs))
end
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then
	local msg = type(groups) == 'table' and groups.err or tostring(groups)
	if string.find(msg, 'no such key', 1, true) then return {0, '', 'no groups'} end
	return redis.error_reply(msg)
end
if #groups == 0 then return {0, '', 'no groups'} end
local bound = ARGV[1]
local names = {}
for _, g in ipairs(groups) do
	local f = {}
	for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
	names[f['name']] = true
	local b = f['last-delivered-id']
	if tonumber(f['pending']) > 0 then
		local p = redis.call('XPENDING', KEYS[1], f['name'])
		if tonumber(p[1]) > 0 and idLess(p[2], b) then b = p[2] end
	end
	if idLess(b, bound) then bound = b end
end
local missing = {0, '', 'missing'}
for i = 2, #ARGV do
	if not names[ARGV[i]] then missing[#missing + 1] = ARGV[i] end
end
if #missing > 3 then return missing end
if bound == '0-0' then return {0, bound, ''} end
return {redis.call('XTRIM', KEYS[1], 'MINID', bound), bound, ''}
`)

// toAny converts strings to script arguments.
func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// policyBound is the lowest id the policy keeps, "" when it keeps all.
func policyBound(ctx context.Context, rdb redis.UniversalClient, stream string, p TrimPolicy) (string, error) {
	var bound string
	if p.MaxAge > 0 {
		now, err := rdb.Time(ctx).Result() // entry ids carry Redis's clock
		if err != nil {
			return "", fmt.Errorf("TIME: %w", err)
		}
		bound = strconv.FormatInt(now.Add(-p.MaxAge).UnixMilli(), 10) + "-0"
	}
	if p.MaxLen > 0 {
		n, err := rdb.XLen(ctx, stream).Result()
		if err != nil {
			return "", fmt.Errorf("XLEN %s: %w", stream, err)
		}
		if excess := n - p.MaxLen; excess > 0 {
			count := min(excess, trimPage)
			page, err := rdb.XRangeN(ctx, stream, "-", "+", count+1).Result()
			if err != nil {
				return "", fmt.Errorf("XRANGE %s: %w", stream, err)
			}
			if int64(len(page)) == count+1 && compareIDs(page[count].ID, bound) > 0 {
				bound = page[count].ID // keeps it, removes the count before it
			}
		}
	}
	return bound, nil
}
