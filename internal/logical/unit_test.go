package logical

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

func TestClassifyMapsServerErrorsToSentinels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  *pgconn.PgError
		want error // nil: passed through as it is
	}{
		{"invalidated, PostgreSQL 16+", &pgconn.PgError{Code: "55000",
			Message: `can no longer get changes from replication slot "s"`}, ErrSlotInvalidated},
		{"invalidated, PostgreSQL 15", &pgconn.PgError{Code: "55000",
			Message: `cannot read from logical replication slot "s"`,
			Detail:  "This slot has been invalidated because it exceeded the maximum reserved size."}, ErrSlotInvalidated},
		{"wal_level", &pgconn.PgError{Code: "55000", Message: "logical decoding requires wal_level >= logical"}, ErrWALLevel},
		{"in use", &pgconn.PgError{Code: "55006", Message: `replication slot "s" is active for PID 42`}, ErrSlotInUse},
		{"missing", &pgconn.PgError{Code: "42704", Message: `replication slot "s" does not exist`}, ErrSlotNotFound},
		{"missing publication", &pgconn.PgError{Code: "42704", Message: `publication "p" does not exist`}, nil},
		{"other 55000", &pgconn.PgError{Code: "55000", Message: "something else"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := classify(fmt.Errorf("starting replication: %w", tc.err))
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "the server's error stays in the chain")
			require.Contains(t, err.Error(), tc.err.Message)
			for _, sentinel := range []error{ErrSlotInvalidated, ErrWALLevel, ErrSlotInUse, ErrSlotNotFound} {
				require.Equal(t, sentinel == tc.want, errors.Is(err, sentinel), "errors.Is(%v, %v)", err, sentinel)
			}
		})
	}
	plain := errors.New("not from the server")
	require.Equal(t, plain, classify(plain))
}

func TestCheckWALLevelSaysHowToFixIt(t *testing.T) {
	t.Parallel()
	require.NoError(t, checkWALLevel("logical"))
	err := checkWALLevel("replica")
	require.ErrorIs(t, err, ErrWALLevel)
	for _, want := range []string{"wal_level=logical", "restart", "wal_level=replica"} {
		require.Contains(t, err.Error(), want)
	}
}

func TestOptionsAreValidated(t *testing.T) {
	t.Parallel()
	tbl := outbox.MustNew("app.outbox", outbox.Columns{})
	o, err := Options{Table: tbl, Slot: "relay_1"}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, tbl.PublicationName(), o.Publication)
	require.Equal(t, DefaultStatusInterval, o.StatusInterval)

	for _, slot := range []string{"", "Relay", "relay-1", "relay 1", `x"; DROP`, string(make([]byte, 64))} {
		_, err := Options{Table: tbl, Slot: slot}.withDefaults()
		require.ErrorIs(t, err, ErrInvalidOptions, "slot %q", slot)
	}
	require.NoError(t, ValidateSlot("abcdefghijklmnopqrstuvwxyz_0123456789_abcdefghijklmnopqrstuvwxy")) // 63
	_, err = Options{Table: tbl, Slot: "s", Publication: "p; DROP"}.withDefaults()
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = Options{Slot: "s"}.withDefaults()
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Equal(t, []string{"proto_version '1'", `publication_names '"Pub_1"'`}, pluginArgs("Pub_1"))
}

func TestTakeConfirmsOnlyTransactionsThatEndWithinTheBatch(t *testing.T) {
	t.Parallel()
	ev := func(n int) outbox.Event { return outbox.Event{ID: fmt.Sprint(n)} }
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &Reader{
		// tx A (1 event) ends at 10; tx B (4 events) at 20; tx C (none) at 30; tx D has begun (1 event).
		events:  []outbox.Event{ev(1), ev(2), ev(3), ev(4), ev(5), ev(6)},
		commits: []commit{{1, 10, at}, {5, 20, at.Add(1)}, {5, 30, at.Add(2)}},
	}
	b := r.take(outbox.Rows(3))
	require.Equal(t, Batch{Events: []outbox.Event{ev(1), ev(2), ev(3)}, Confirm: 10, LastCommit: at}, b)
	require.EqualValues(t, 10, r.returned)
	b = r.take(outbox.Rows(3))
	require.Equal(t, Batch{Events: []outbox.Event{ev(4), ev(5), ev(6)}, Confirm: 30, LastCommit: at.Add(2)}, b,
		"B ends within, so does C (no events), D does not")
	require.False(t, r.gathered())
	b = r.take(outbox.Rows(3))
	require.Empty(t, b.Events)
	require.Zero(t, b.Confirm)
	require.EqualValues(t, 30, r.returned)
}

// TestTakeKeepsWithinTheByteBudget: a batch takes the events whose sizes
// fit in limit.Bytes (the first one always, however large), confirms only
// the transactions that end within what it took, and keeps the rest, with
// their size, for the next batch.
func TestTakeKeepsWithinTheByteBudget(t *testing.T) {
	t.Parallel()
	ev := func(n, size int) outbox.Event {
		return outbox.Event{ID: fmt.Sprint(n), Payload: strings.Repeat("x", size-1)}
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	events := []outbox.Event{ev(1, 400), ev(2, 400), ev(3, 400), ev(4, 2000), ev(5, 100)}
	r := &Reader{events: events, bytes: 3300, commits: []commit{{2, 10, at}, {4, 20, at.Add(1)}, {5, 30, at.Add(2)}}}
	limit := outbox.Limit{Rows: 10, Bytes: 1000}

	b := r.take(limit)
	require.Equal(t, Batch{Events: events[:2], Confirm: 10, LastCommit: at}, b, "two of 400 fit in 1000, not three")
	require.Equal(t, 2500, r.bytes)
	b = r.take(limit)
	require.Equal(t, Batch{Events: events[2:3]}, b, "the third alone: with the fourth it is over; its transaction goes on")
	b = r.take(limit)
	require.Equal(t, Batch{Events: events[3:4], Confirm: 20, LastCommit: at.Add(1)}, b, "larger than the budget: alone")
	b = r.take(limit)
	require.Equal(t, Batch{Events: events[4:5], Confirm: 30, LastCommit: at.Add(2)}, b)
	require.Zero(t, r.bytes)
	require.False(t, r.gathered())
}

func TestRelationMapsColumnsByName(t *testing.T) {
	t.Parallel()
	cols := outbox.MustNew("", outbox.Columns{Key: "agg"}).Columns()
	types := pgtype.NewMap()
	text := func(s string) *pglogrepl.TupleDataColumn {
		return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
	}
	null := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
	toast := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
	relation := func(names ...string) *relation {
		m := &pglogrepl.RelationMessage{}
		for _, n := range names {
			oid := uint32(pgtype.TextOID)
			if n == "created_at" {
				oid = pgtype.TimestamptzOID
			}
			m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: n, DataType: oid})
		}
		return newRelation(m, cols, nil)
	}

	// Another order than the default table's, and a column the layout does not know.
	rel := relation("payload", "extra", "created_at", "event_type", "agg", "id")
	e := rel.event(cols, &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{
		text(`{"a":1}`), text("x"), text("2026-01-02 03:04:05.123456+00"), text("order.created"), text("k1"), text("e1"),
	}}, types)
	require.Empty(t, e.Malformed)
	require.Equal(t, "e1", e.ID)
	require.Equal(t, "order.created", e.Type)
	require.Equal(t, `{"a":1}`, e.Payload)
	require.Equal(t, "k1", e.Key)
	require.True(t, time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC).Equal(e.CreatedAt), "created %s", e.CreatedAt)

	// The payload column renamed away, a NULL type, an unchanged-TOAST
	// marker, a tuple shorter than its relation: a Malformed event, no panic.
	rel = relation("id", "event_type", "body", "created_at", "agg", "payload")
	e = rel.event(cols, &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{text("e2"), null, text("{}"), toast}}, types)
	require.Equal(t, "e2", e.ID)
	require.Equal(t, "NULL in column event_type, payload", e.Malformed)
	require.True(t, e.CreatedAt.IsZero())
	require.Empty(t, e.Key)
	require.Equal(t, outbox.NewEvent(cols, nil, nil, nil, nil), relation().event(cols, nil, types))
}

// TestPartitionKeysAndNewPartitions: the record of partitions published is
// their keys, sorted; a partition whose key it lacks is new (attached, or
// attached again), and a table taken out of it (made UNLOGGED) is new once
// back.
func TestPartitionKeysAndNewPartitions(t *testing.T) {
	a := Partition{Schema: "public", Name: "a", Key: "16400:750"}
	b := Partition{Schema: "public", Name: "b", Key: "16388:741"}
	recorded := PartitionKeys([]Partition{a, b})
	require.Equal(t, "16388:741,16400:750", recorded)
	require.Empty(t, NewPartitions([]Partition{a, b}, recorded))
	require.Empty(t, NewPartitions([]Partition{a}, recorded), "a partition gone is not new")

	again := Partition{Schema: "public", Name: "b", Key: "16388:802"} // detached and attached again
	c := Partition{Schema: "public", Name: "c", Key: "16410:811.809"}
	require.Equal(t, []Partition{again, c}, NewPartitions([]Partition{a, again, c}, recorded))
	require.Equal(t, []Partition{a, b}, NewPartitions([]Partition{a, b}, ""), "nothing recorded: every one is new")

	require.Equal(t, "16400:750", WithoutTables(recorded, []int64{16388}))
	require.Equal(t, recorded, WithoutTables(recorded, []int64{1638}), "by the whole oid")
	require.Equal(t, []Partition{b}, NewPartitions([]Partition{a, b}, WithoutTables(recorded, []int64{16388})))
}
