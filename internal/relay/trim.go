package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// ErrNoConsumerGroup is Trim leaving alone a stream that has no consumer
// group: nothing says what its consumers have read. A stream reset takes
// the groups with the stream (they live in its key), and the replay and the
// backlog then land in a stream without groups until the consumers create
// theirs again at "0": trimmed by the policy alone meanwhile, those entries
// would be gone before any consumer read them.
var ErrNoConsumerGroup = errors.New("the stream has no consumer group: not trimmed")

// trimOnce trims the stream once and counts what it removed; a failure is
// logged at debug level (the batches report Redis's faults), a stream left
// alone for want of a group once at info level.
func (r *Relay) trimOnce(ctx context.Context) {
	n, bound, err := Trim(ctx, r.rdb, r.cfg.Stream, r.cfg.Trim, r.cfg.PublishTimeout)
	if errors.Is(err, ErrNoConsumerGroup) {
		if !r.trimHeld {
			r.trimHeld = true
			r.log.Info("Not trimming the stream: it has no consumer group, and a group created later at 0 must find every entry")
		}
		return
	}
	r.trimHeld = false
	if err != nil {
		r.log.Debug("Trimming the stream failed, retrying at the next interval", "error", err.Error())
		return
	}
	if n > 0 {
		r.cfg.Metrics.stream.Trimmed.Add(float64(n))
		r.log.Debug("Trimmed the stream", "entries", n, "minID", bound)
	}
}

// Trim removes the entries of stream that the policy allows and every
// consumer group is done with: it computes the policy's bound (an id), the
// groups' bound (the lowest of each group's last-delivered-id and oldest
// pending entry, from XINFO GROUPS and XPENDING), and runs XTRIM MINID with
// the lower of the two. It returns the entries removed and the bound.
//
// A stream without groups is not trimmed: ErrNoConsumerGroup. A group
// created between the reading of the groups and the XTRIM, at an id below
// the bound, can miss entries; a group created later at "$" or at the
// stream's end never can.
func Trim(ctx context.Context, rdb redis.UniversalClient, stream string, p TrimPolicy, timeout time.Duration) (int64, string, error) {
	if !p.enabled() {
		return 0, "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bound, err := policyBound(ctx, rdb, stream, p)
	if err != nil || bound == "" {
		return 0, "", err
	}
	groups, n, err := groupsBound(ctx, rdb, stream, timeout)
	if err != nil {
		return 0, "", err
	}
	if n == 0 {
		return 0, "", ErrNoConsumerGroup
	}
	if compareIDs(groups, bound) < 0 {
		bound = groups
	}
	if bound == "0-0" {
		return 0, bound, nil
	}
	trimmed, err := rdb.XTrimMinID(ctx, stream, bound).Result()
	if err != nil {
		return 0, bound, fmt.Errorf("XTRIM %s MINID %s: %w", stream, bound, err)
	}
	return trimmed, bound, nil
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

// groupsBound is the lowest id some consumer group of stream still needs:
// for each group, its oldest pending entry (delivered, not acknowledged)
// or, with none pending, its last-delivered-id (every entry after it is
// undelivered). It returns "" and 0 for a stream without groups (or none
// at all).
func groupsBound(ctx context.Context, rdb redis.UniversalClient, stream string, timeout time.Duration) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if isNoSuchKey(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
	}
	bound := ""
	for _, g := range groups {
		b := g.LastDeliveredID
		if g.Pending > 0 {
			pend, err := rdb.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return "", 0, fmt.Errorf("XPENDING %s %s: %w", stream, g.Name, err)
			}
			if pend.Count > 0 && compareIDs(pend.Lower, b) < 0 {
				b = pend.Lower
			}
		}
		if bound == "" || compareIDs(b, bound) < 0 {
			bound = b
		}
	}
	return bound, len(groups), nil
}
