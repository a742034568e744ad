package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// One OutboxRelay per table (docs/api.md): two relays of one table that
// publish to different streams split its rows between the streams, and a
// Polling relay beside a slot's relay loses the rows it has not published
// to the slot's cleanup by age. Each relay registers its stream and slot in
// the table's relays table (outbox.RecordRelay) every TableCheckInterval
// and looks at the others there: the database is what every relay of the
// table shares, whatever its namespace, Secret or cluster.

// DefaultTableCheckInterval is how often a relay refreshes its row in the
// relays table and looks at the others (Config.TableCheckInterval).
const DefaultTableCheckInterval = 10 * time.Second

// tableShare is what the relay last found in the relays table: the relays
// of the table it conflicts with (outbox.TableRelay.Conflicts).
type tableShare struct {
	mu sync.Mutex
	// since is the server's clock at the relay's first record: a row last
	// refreshed before it is of a relay that stopped before this one
	// started (one run after another on the same table, a stream renamed).
	since time.Time
	// others are the conflicting relays found by the last look.
	others []outbox.TableRelay
	// said is what was last logged of them.
	said string
	// warned: the relays table could not be written, said once.
	warned bool
}

// refusal is the error that stops a Polling relay's claims while relays of
// other streams or of the other source relay the table; nil when none.
func (s *tableShare) refusal(table *outbox.Table) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.others) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s relayed also by %s (seen in %s)", outbox.ErrTableShared, table,
		strings.Join(names(s.others), "; "), table.RelaysTable())
}

func names(relays []outbox.TableRelay) []string {
	n := make([]string, 0, len(relays))
	for _, r := range relays {
		n = append(n, r.String())
	}
	return n
}

// self is this relay as the relays table has it.
func (r *Relay) self() outbox.TableRelay {
	s := outbox.TableRelay{Stream: r.cfg.Stream}
	if r.cfg.Source == SourceLogicalReplication {
		s.Slot = r.cfg.Slot
	}
	return s
}

// sharedWindow is how long after its last refresh a relay's row counts as
// a running relay: three refreshes (the relays of a table share the
// interval).
func (r *Relay) sharedWindow() time.Duration { return 3 * r.cfg.TableCheckInterval }

// watchTable registers the relay and looks at the table's other relays
// every TableCheckInterval until ctx ends, and once more then.
func (r *Relay) watchTable(ctx context.Context) {
	func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := r.cfg.Table.ApplyDDL(ctx, r.db, r.cfg.Table.RelaysDDL()); err != nil {
			r.log.Warn("Could not create the relays table; another relay of the table, of another stream or source, "+
				"will go unnoticed until it exists (relay schema --apply)",
				"relaysTable", r.cfg.Table.RelaysTable(), "error", err.Error())
			r.shared.warned = true
		}
	}()
	tick := time.NewTicker(r.cfg.TableCheckInterval)
	defer tick.Stop()
	for {
		r.lookAtTable(ctx)
		select {
		case <-ctx.Done():
			// Once more at the end: a relay that stops (scaled to zero,
			// suspended) leaves rows that are its own to publish when it is
			// back, which the row says to cleanup --slot.
			r.lookAtTable(context.WithoutCancel(ctx))
			return
		case <-tick.C:
		}
	}
}

// lookAtTable refreshes the relay's row and finds the relays it conflicts
// with, seen since it started and within sharedWindow. It logs an error
// naming them when they change, and a slot's relay, which streams on (a
// slot that is not read holds the WAL), counts each look that finds any as
// kind table_shared; a Polling relay refuses its claims meanwhile
// (claim), counted there.
func (r *Relay) lookAtTable(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, self := r.cfg.Table, r.self()
	if _, err := t.RecordRelay(ctx, r.db, self); err != nil {
		if ctx.Err() == nil && !r.shared.warned {
			r.shared.warned = true
			r.log.Warn("Could not register the relay in the relays table; another relay of the table, of another stream "+
				"or source, may go unnoticed (relay schema --apply)", "relaysTable", t.RelaysTable(), "error", err.Error())
		}
		return
	}
	relays, now, _, err := t.ReadRelays(ctx, r.db)
	if err != nil {
		return // the next look tries again
	}
	r.shared.mu.Lock()
	defer r.shared.mu.Unlock()
	if r.shared.since.IsZero() {
		r.shared.since = now
	}
	others := slices.DeleteFunc(relays, func(o outbox.TableRelay) bool {
		return !self.Conflicts(o) || !o.SeenAt.After(r.shared.since) || now.Sub(o.SeenAt) > r.sharedWindow()
	})
	r.shared.others = others
	said := strings.Join(names(others), "; ")
	if said != r.shared.said {
		r.shared.said = said
		switch {
		case len(others) == 0:
			r.log.Info("No other relay of the table publishes to another stream or with the other source any more",
				"table", t.String())
		case r.cfg.Source == SourceLogicalReplication:
			r.log.Error("Other relays of the table publish to other streams or with the other source: one OutboxRelay "+
				"per table; cleanup --slot deletes nothing meanwhile", "table", t.String(), "kind", ErrorKindTableShared,
				"otherRelays", said, "relaysTable", t.RelaysTable())
		default:
			r.log.Error("Other relays of the table publish to other streams or with the other source: one OutboxRelay "+
				"per table; this relay claims nothing meanwhile", "table", t.String(), "kind", ErrorKindTableShared,
				"otherRelays", said, "relaysTable", t.RelaysTable())
		}
	}
	if len(others) > 0 && r.cfg.Source == SourceLogicalReplication {
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindTableShared).Inc()
	}
}
