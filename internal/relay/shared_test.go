package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
)

// TestTableRelaysConflict: relays of one stream and source share a table
// by design (ordering members, standbys, replicas); another stream or the
// other source does not.
func TestTableRelaysConflict(t *testing.T) {
	t.Parallel()
	polling := outbox.TableRelay{Stream: "jobs"}
	slot := outbox.TableRelay{Stream: "jobs", Slot: "s"}
	for _, c := range []struct {
		a, b     outbox.TableRelay
		conflict bool
	}{
		{polling, polling, false},
		{slot, slot, false},
		{slot, outbox.TableRelay{Stream: "jobs", Slot: "s2"}, false},
		{polling, slot, true},
		{polling, outbox.TableRelay{Stream: "other"}, true},
		{slot, outbox.TableRelay{Stream: "other", Slot: "s"}, true},
	} {
		require.Equal(t, c.conflict, c.a.Conflicts(c.b), "%s beside %s", c.a, c.b)
		require.Equal(t, c.conflict, c.b.Conflicts(c.a), "%s beside %s", c.b, c.a)
	}
}

// TestPollingRelayClaimsNothingBesideARelayOfAnotherStream: a Polling relay
// that finds another relay of its table registered and running (here a
// slot's relay of another stream, refreshing its row) claims nothing,
// counts kind table_shared and logs an error naming the table and the
// other relay; once the other stops refreshing, it relays again.
func TestPollingRelayClaimsNothingBesideARelayOfAnotherStream(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	var logs syncbuf.Buffer
	m := NewMetrics()
	shared := m.Errors.WithLabelValues(ErrorKindTableShared)
	r := b.newRelay(t, Config{TableCheckInterval: time.Second, Logger: newTestLogger(&logs), Metrics: m})
	require.NoError(t, b.table.ApplyDDL(context.Background(), b.db, b.table.RelaysDDL()))

	// The other relay refreshes its row, as a running one does, until stopped.
	other := outbox.TableRelay{Stream: "elsewhere", Slot: "orders_slot"}
	ctx, stopOther := context.WithCancel(context.Background())
	otherDone := make(chan struct{})
	go func() {
		defer close(otherDone)
		for ctx.Err() == nil {
			_, _ = b.table.RecordRelay(ctx, b.db, other)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopOther(); <-otherDone })

	runInBackground(t, r)
	waitFor(t, "a claim refused as table_shared", func() bool { return testutilCounter(shared) >= 1 })
	ids := b.insert(t, 20)
	refused := testutilCounter(shared)
	waitFor(t, "two more claims refused", func() bool { return testutilCounter(shared) >= refused+2 })
	require.Zero(t, b.streamLen(t), "nothing published beside the other relay")
	require.EqualValues(t, len(ids), b.backlog(t))
	line := ""
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "Other relays of the table publish to other streams") {
			line = l
		}
	}
	require.NotEmpty(t, line, "the error naming the other relay:\n%s", logs.String())
	require.Contains(t, line, "level=ERROR")
	require.Contains(t, line, "table=outbox_events")
	require.Contains(t, line, "stream elsewhere (source LogicalReplication, slot orders_slot)")
	require.Contains(t, line, "kind=table_shared")
	require.NotContains(t, logs.String(), b.dsn)

	stopOther()
	<-otherDone
	waitFor(t, "every row published once the other relay is gone", func() bool { return b.streamLen(t) == int64(len(ids)) })
	requireEachOnce(t, b.readStream(t, b.stream), ids)
	require.Contains(t, logs.String(), "No other relay of the table publishes to another stream")
}
