package backlog

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// connSet is the account of every connection of a PoolMeasurer, under its
// lock: how many are open (being made included) against the bound, which
// are idle (the one idle the longest first), and the checks waiting for
// one.
type connSet struct {
	open, max int
	dialing   int
	waiting   int
	idle      []*idleConn
	// freed is closed, and replaced, when a connection is closed or given
	// back idle: the waiting checks look again.
	freed  chan struct{}
	expiry *time.Timer
	closed bool
}

// idleConn is a connection kept for the next check of its pool.
type idleConn struct {
	conn  *pgx.Conn
	pool  string
	since time.Time
}

func newConnSet(limit int) connSet {
	return connSet{max: limit, freed: make(chan struct{})}
}

// full reports that no connection can be opened without closing one.
func (s *connSet) full() bool { return s.open >= s.max }

// startDial counts a connection being made.
func (s *connSet) startDial() {
	s.open++
	s.dialing++
}

// endDial counts a dial that ended; a failed one is then counted closed by
// closedOne.
func (s *connSet) endDial() { s.dialing-- }

// closedOne counts a connection closed (its socket closed), or a dial that
// failed.
func (s *connSet) closedOne() {
	s.open--
	s.signal()
}

// waitStart counts a check waiting for a connection and returns the channel
// closed when one may be free.
func (s *connSet) waitStart() <-chan struct{} {
	s.waiting++
	return s.freed
}

// waitEnd counts a wait that ended.
func (s *connSet) waitEnd() { s.waiting-- }

func (s *connSet) signal() {
	close(s.freed)
	s.freed = make(chan struct{})
}

// takeIdle takes the idle connection of pool pk used last, or nil.
func (s *connSet) takeIdle(pk string) *idleConn {
	for i := len(s.idle) - 1; i >= 0; i-- {
		if ic := s.idle[i]; ic.pool == pk {
			s.idle = slices.Delete(s.idle, i, i+1)
			return ic
		}
	}
	return nil
}

// takeAllIdle takes every idle connection of pool pk.
func (s *connSet) takeAllIdle(pk string) []*idleConn {
	var taken []*idleConn
	s.idle = slices.DeleteFunc(s.idle, func(ic *idleConn) bool {
		if ic.pool == pk {
			taken = append(taken, ic)
			return true
		}
		return false
	})
	return taken
}

// evict takes the connection idle the longest, of any pool, to be closed
// for room; nil when none is idle.
func (s *connSet) evict() *idleConn {
	if len(s.idle) == 0 {
		return nil
	}
	ic := s.idle[0]
	s.idle = slices.Delete(s.idle, 0, 1)
	return ic
}

// putIdle keeps a connection given back, and returns those idle longer than
// maxIdle, to be closed; the timer calls onExpiry when the next one is due.
func (s *connSet) putIdle(ic *idleConn, maxIdle time.Duration, onExpiry func()) []*idleConn {
	s.idle = append(s.idle, ic)
	s.signal()
	return s.expire(ic.since, maxIdle, onExpiry)
}

// expire takes the connections idle longer than maxIdle at now, to be
// closed, and sets the timer for the next.
func (s *connSet) expire(now time.Time, maxIdle time.Duration, onExpiry func()) []*idleConn {
	n := 0
	for n < len(s.idle) && now.Sub(s.idle[n].since) >= maxIdle {
		n++
	}
	expired := slices.Clone(s.idle[:n])
	s.idle = slices.Delete(s.idle, 0, n)
	switch {
	case s.closed || len(s.idle) == 0:
		if s.expiry != nil {
			s.expiry.Stop()
		}
	case s.expiry == nil:
		s.expiry = time.AfterFunc(s.idle[0].since.Add(maxIdle).Sub(now), onExpiry)
	default:
		s.expiry.Reset(s.idle[0].since.Add(maxIdle).Sub(now))
	}
	return expired
}

// close marks the set closed and takes every idle connection, to be closed.
func (s *connSet) close() []*idleConn {
	s.closed = true
	if s.expiry != nil {
		s.expiry.Stop()
	}
	idle := s.idle
	s.idle = nil
	s.signal()
	return idle
}

// close closes the connection; nil does nothing.
func (ic *idleConn) close() {
	if ic != nil {
		closeConn(ic.conn)
	}
}

// closeConn closes a connection, telling the server, within a second.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
