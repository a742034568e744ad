package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadDeadLetterPayloadsLeavesLargeOnesUnread: a retry locks parked
// rows without their payloads and reads only those within the limit; a
// larger payload and a NULL one stay nil, and the sizes are the bytes
// stored.
func TestReadDeadLetterPayloadsLeavesLargeOnesUnread(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, created_at, stream, reason)
		VALUES ('small', 't', 'héllo', now(), 's', 'test'),
		       ('large', 't', repeat('x', 1000), now(), 's', 'test'),
		       ('null', 't', NULL, now(), 's', 'test');`)
	ctx := context.Background()

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	page, err := tbl.LockDeadLetters(ctx, tx, DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, page, 3)
	for _, d := range page {
		require.Nil(t, d.Payload, "the lock reads no payload")
	}
	require.Equal(t, int64(6), *page[0].PayloadBytes, "bytes, not characters")
	require.Equal(t, int64(1000), *page[1].PayloadBytes)
	require.Nil(t, page[2].PayloadBytes)

	require.NoError(t, tbl.ReadDeadLetterPayloads(ctx, tx, page, 999))
	require.Equal(t, "héllo", *page[0].Payload)
	require.Nil(t, page[1].Payload, "over the limit: not read")
	require.Nil(t, page[2].Payload, "NULL stays NULL")

	// A row gone since it was listed (discarded by someone who did not
	// lock it first) is an error, not a nil payload published as empty.
	gone := []DeadLetter{{ID: page[2].ID + 1000, PayloadBytes: page[0].PayloadBytes}}
	err = tbl.ReadDeadLetterPayloads(ctx, tx, gone, 999)
	require.ErrorContains(t, err, "read 0 of the 1 parked payloads")
}

// TestDeadLetterDDLAddsTheKeyColumn: a dead-letter table made before the
// key column gets it from DeadLetterDDL, and a parked row keeps what it
// had; applied again, the DDL changes nothing.
func TestDeadLetterDDLAddsTheKeyColumn(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	_, err := db.Exec(ctx, `DROP TABLE outbox_events_dead_letters;
		CREATE TABLE outbox_events_dead_letters (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NULL, event_type text NULL, payload text NULL,
			created_at timestamptz NULL, stream text NOT NULL, reason text NOT NULL,
			parked_at timestamptz NOT NULL DEFAULT now(), attempts integer NOT NULL DEFAULT 1);
		INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, stream, reason) VALUES ('e1', 't', 'p', 's', 'r')`)
	require.NoError(t, err)
	_, err = tbl.ListDeadLetters(ctx, db, DeadLetterFilter{})
	require.ErrorContains(t, err, "relay schema --apply", "the missing column is named with its fix")

	for range 2 {
		require.NoError(t, tbl.EnsureDeadLetterTable(ctx, db))
	}
	parked, err := tbl.ListDeadLetters(ctx, db, DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "e1", *parked[0].EventID)
	require.Nil(t, parked[0].Key)
}
