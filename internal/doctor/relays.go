package doctor

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// RelaysCheckName is the name of the check RelaysCheck makes.
const RelaysCheckName = "outbox.relays"

// Reasons of the relays check. The operator's Ready condition uses
// ReasonTableShared for the same finding (api/v1alpha1).
const (
	// ReasonTableShared: relays of other streams, or of the other source,
	// were seen in the relays table within outbox.RelaySeenWindow.
	ReasonTableShared = "TableShared"
	// ReasonTableNotShared: none was.
	ReasonTableNotShared = "TableNotShared"
	// ReasonRelaysTableMissing: the relays table does not exist yet.
	ReasonRelaysTableMissing = "RelaysTableMissing"
	// ReasonRelaysUnknown: the relays table could not be read.
	ReasonRelaysUnknown = "RelaysUnknown"
)

// RelaysCheck: one OutboxRelay per table. It fails when the relays table
// (outbox.Table.RelaysTable) holds relays of other streams, or of the other
// source, than self (the doctor's --stream and --slot) seen within
// outbox.RelaySeenWindow: the relays of one table split its rows between
// their streams, and a polling relay beside a LogicalReplication relay
// loses rows to the slot's cleanup. A missing relays table is info (the
// relay creates it at start) or, when the role may not create it, a
// warning, as the dead-letter table's.
func RelaysCheck(f PostgresFacts, t *outbox.Table, self outbox.TableRelay) Check {
	c := Check{Name: RelaysCheckName}
	rt := t.RelaysTable()
	switch {
	case f.RelaysErr != "":
		c.Status, c.Reason = Warn, ReasonRelaysUnknown
		c.Message = fmt.Sprintf("reading %s failed: %s; a relay of the table of another stream or source cannot be seen.",
			rt, f.RelaysErr)
		c.Fix = fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s TO <role> (the relays register there).", rt)
		return c
	case !f.RelaysFound && f.SchemaCreate:
		c.Status, c.Reason = Info, ReasonRelaysTableMissing
		c.Message = fmt.Sprintf("relays table %s does not exist yet: no relay of this version has run on the table "+
			"(relays of earlier versions do not register); the relay creates it at start.", rt)
		return c
	case !f.RelaysFound:
		c.Status, c.Reason = Warn, ReasonRelaysTableMissing
		c.Message = fmt.Sprintf("relays table %s does not exist and the role may not create it: a relay of the table "+
			"of another stream or source goes unnoticed.", rt)
		c.Fix = "run `relay schema --apply` as the table's owner (it creates the relays table)."
		return c
	}
	recent := outbox.RecentConflicts(f.Relays, self, f.RelaysNow, outbox.RelaySeenWindow)
	var stale []outbox.TableRelay
	for _, r := range f.Relays {
		if self.Conflicts(r) && f.RelaysNow.Sub(r.SeenAt) > outbox.RelaySeenWindow {
			stale = append(stale, r)
		}
	}
	if len(recent) > 0 {
		c.Status, c.Reason = Fail, ReasonTableShared
		c.Message = fmt.Sprintf("relays of other streams or sources than this one, %s, relay table %s: %s. The relays "+
			"of one table split its rows between their streams, and a polling relay beside a LogicalReplication relay "+
			"loses rows to the slot's cleanup.", self, t, seen(recent, f.RelaysNow))
		c.Fix = "keep one OutboxRelay per table: stop or delete the other relays (if one is the relay checked here, " +
			"pass its --stream and --slot); once one is gone for good, forget it: " + forget(rt, recent)
		return c
	}
	c.Status, c.Reason = OK, ReasonTableNotShared
	c.Message = fmt.Sprintf("no relay of another stream or source than this one, %s, was seen in %s within the last %s.",
		self, rt, outbox.RelaySeenWindow)
	if len(stale) > 0 {
		c.Message += fmt.Sprintf(" Registered earlier: %s; `relay cleanup --slot` refuses while one of another stream "+
			"is registered.", seen(stale, f.RelaysNow))
		c.Fix = "once such a relay is gone for good: " + forget(rt, stale)
	}
	return c
}

// seen names relays and when they were last seen.
func seen(relays []outbox.TableRelay, now time.Time) string {
	s := make([]string, 0, len(relays))
	for _, r := range relays {
		s = append(s, fmt.Sprintf("%s, last seen %s (%s ago)", r, r.SeenAt.UTC().Format(time.RFC3339),
			max(now.Sub(r.SeenAt), 0).Round(time.Second)))
	}
	return strings.Join(s, "; ")
}

// forget is the DELETE of each relay's row, for a person to copy.
func forget(table string, relays []outbox.TableRelay) string {
	s := make([]string, 0, len(relays))
	for _, r := range relays {
		s = append(s, fmt.Sprintf("DELETE FROM %s WHERE stream = %s AND slot = %s;", table, sqlString(r.Stream), sqlString(r.Slot)))
	}
	return strings.Join(s, " ")
}

// sqlString is s as an SQL string literal.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
