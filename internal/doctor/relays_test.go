package doctor

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestRelaysCheckJudgesTheFacts: relays of another stream or of the other
// source seen within 30s fail the check, naming them, when last seen, and
// the DELETE that forgets one gone for good; the doctor's own stream and
// source, and rows older than 30s, do not; a missing relays table is info,
// or a warning when the role may not create it.
func TestRelaysCheckJudgesTheFacts(t *testing.T) {
	t.Parallel()
	tbl := outbox.MustNew("outbox_events", outbox.Columns{})
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	polling := outbox.TableRelay{Stream: "jobs"}
	at := func(r outbox.TableRelay, ago time.Duration) outbox.TableRelay { r.SeenAt = now.Add(-ago); return r }
	facts := func(relays ...outbox.TableRelay) PostgresFacts {
		return PostgresFacts{TableFound: true, SchemaCreate: true, RelaysFound: true, Relays: relays, RelaysNow: now}
	}
	for name, tc := range map[string]struct {
		f      PostgresFacts
		self   outbox.TableRelay
		status Status
		reason string
		want   []string
	}{
		"none": {facts(), polling, OK, ReasonTableNotShared, []string{"no relay of another stream or source than this one, " +
			"stream jobs (source Polling), was seen in outbox_events_relays within the last 30s"}},
		"the other source": {facts(at(polling, time.Second), at(outbox.TableRelay{Stream: "jobs", Slot: "s"}, time.Second)),
			outbox.TableRelay{Stream: "jobs", Slot: "s2"}, Fail, ReasonTableShared,
			[]string{"stream jobs (source Polling), last seen 2026-05-06T07:08:08Z (1s ago)"}},
		"another stream": {facts(at(polling, 0), at(outbox.TableRelay{Stream: "audit", Slot: "audit_slot"}, 5*time.Second)),
			polling, Fail, ReasonTableShared, []string{
				"stream audit (source LogicalReplication, slot audit_slot), last seen 2026-05-06T07:08:04Z (5s ago)",
				"DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = 'audit_slot';",
			}},
		"gone": {facts(at(polling, 0), at(outbox.TableRelay{Stream: "audit"}, time.Hour)), polling, OK, ReasonTableNotShared,
			[]string{"Registered earlier: stream audit (source Polling), last seen 2026-05-06T06:08:09Z (1h0m0s ago)"}},
		"no table": {PostgresFacts{TableFound: true, SchemaCreate: true}, polling, Info, ReasonRelaysTableMissing,
			[]string{"does not exist yet"}},
		"no table, no way": {PostgresFacts{TableFound: true}, polling, Warn, ReasonRelaysTableMissing, []string{"may not create it"}},
		"unreadable": {PostgresFacts{TableFound: true, RelaysErr: "permission denied"}, polling, Warn, ReasonRelaysUnknown,
			[]string{"reading outbox_events_relays failed: permission denied"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := RelaysCheck(tc.f, tbl, tc.self)
			require.Equal(t, RelaysCheckName, c.Name)
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, tc.reason, c.Reason)
			for _, w := range tc.want {
				require.Contains(t, c.Message+" Fix: "+c.Fix, w)
			}
		})
	}
	// Relays of the doctor's own stream and source (another slot of it
	// included) are no reason.
	c := RelaysCheck(facts(at(outbox.TableRelay{Stream: "jobs", Slot: "s"}, time.Second)), tbl,
		outbox.TableRelay{Stream: "jobs", Slot: "s2"})
	require.Equal(t, OK, c.Status, c.Message)
}

// TestGatherRelays reads a real relays table: missing, then registered
// relays of the doctor's stream and of another one.
func TestGatherRelays(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgxpool.New(ctx, testenv.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	tbl := outbox.MustNew("outbox_events", outbox.Columns{})
	_, err = db.Exec(ctx, tbl.DDL(outbox.DDLOptions{}))
	require.NoError(t, err)
	_, err = db.Exec(ctx, `DROP TABLE `+tbl.RelaysTableName())
	require.NoError(t, err)
	self := outbox.TableRelay{Stream: "jobs"}

	c := RelaysCheck(GatherPostgres(ctx, db, tbl), tbl, self)
	require.Equal(t, Info, c.Status, c.Message)
	require.Equal(t, ReasonRelaysTableMissing, c.Reason)

	require.NoError(t, tbl.ApplyDDL(ctx, db, tbl.RelaysDDL()))
	_, err = tbl.RecordRelay(ctx, db, self)
	require.NoError(t, err)
	c = RelaysCheck(GatherPostgres(ctx, db, tbl), tbl, self)
	require.Equal(t, OK, c.Status, c.Message)

	_, err = tbl.RecordRelay(ctx, db, outbox.TableRelay{Stream: "audit"})
	require.NoError(t, err)
	c = RelaysCheck(GatherPostgres(ctx, db, tbl), tbl, self)
	require.Equal(t, Fail, c.Status, c.Message)
	require.Equal(t, ReasonTableShared, c.Reason)
	require.Contains(t, c.Message, "stream audit (source Polling), last seen ")
	require.Contains(t, c.Fix, "DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = '';")

	_, err = db.Exec(ctx, `DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = ''`)
	require.NoError(t, err)
	c = RelaysCheck(GatherPostgres(ctx, db, tbl), tbl, self)
	require.Equal(t, OK, c.Status, "the fix works: %s", c.Message)
}
