package relay

import (
	"context"
	"sync"
)

// sequencer lets a relay keep two batches in flight without giving up
// order: claims happen one at a time (the claim token), each claim takes a
// ticket, and batches are published strictly in ticket order. So while one
// batch is being published and committed, the next one is already being
// claimed, and the stream still receives the events in created_at order.
//
// Every ticket taken must be finished with done, on every path.
type sequencer struct {
	claim chan struct{} // holds the claim token when it is free

	mu     sync.Mutex
	cond   *sync.Cond
	next   uint64 // the next ticket to hand out
	served uint64 // the ticket whose turn it is to publish
}

func newSequencer() *sequencer {
	s := &sequencer{claim: make(chan struct{}, 1)}
	s.cond = sync.NewCond(&s.mu)
	s.claim <- struct{}{}
	return s
}

// acquire takes the claim token and a ticket; false when ctx ended first.
func (s *sequencer) acquire(ctx context.Context) (uint64, bool) {
	select {
	case <-s.claim:
	case <-ctx.Done():
		return 0, false
	}
	if ctx.Err() != nil { // both were ready: stopping wins
		s.release()
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.next
	s.next++
	return t, true
}

// release gives the claim token back.
func (s *sequencer) release() { s.claim <- struct{}{} }

// wait blocks until it is ticket t's turn to publish.
func (s *sequencer) wait(t uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.served != t {
		s.cond.Wait()
	}
}

// done ends ticket t's turn. It waits for the turn first, so that a ticket
// that never published (an empty claim, an error) still keeps the order.
func (s *sequencer) done(t uint64) {
	s.wait(t)
	s.mu.Lock()
	s.served = t + 1
	s.mu.Unlock()
	s.cond.Broadcast()
}
