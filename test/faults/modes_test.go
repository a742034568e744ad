//go:build faults

package faults

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// cleanupMode is the relay's --cleanup-mode in a case (docs/relay.md,
// "Cleanup modes"). Each mode promises the same: nothing lost, the ordering
// kept, unpublishable rows parked.
type cleanupMode string

const (
	// afterRetention is the default: a claim marks its rows dispatched and
	// they stay until relay cleanup deletes them.
	afterRetention cleanupMode = "AfterRetention"
	// onDispatch: a claim deletes its rows, committed after Redis
	// acknowledged them; a parked row moves to the dead-letter table.
	onDispatch cleanupMode = "OnDispatch"
)

// args are the mode's flags of relay run: none for the default, so that
// the default is what a relay run without the flag does. A relay without
// --cleanup-mode (an older build given with FAULTS_RELAY_BIN) fails the
// other mode's cases.
func (m cleanupMode) args(t testing.TB) []string {
	t.Helper()
	if m == afterRetention {
		return nil
	}
	require.True(t, runHelpLists(t, "--cleanup-mode"), "this relay has no --cleanup-mode: it cannot run %s", m)
	return []string{"--cleanup-mode", string(m)}
}

// forCleanupModes runs body once per cleanup mode, as parallel subtests
// named by the mode, so that -run /OnDispatch selects every case's
// OnDispatch run.
func forCleanupModes(t *testing.T, body func(t *testing.T, mode cleanupMode)) {
	t.Helper()
	forModes(t, cleanupModes(false), body)
}

// forCleanupModesOnDispatchAtFull is forCleanupModes for a case whose
// OnDispatch run only FAULTS_SCALE=full makes, to keep the CI slice within
// its minutes: in the slice that subtest does not exist (CI skips nothing).
func forCleanupModesOnDispatchAtFull(t *testing.T, body func(t *testing.T, mode cleanupMode)) {
	t.Helper()
	forModes(t, cleanupModes(true), body)
}

// cleanupModes are the modes a case runs in at this scale.
func cleanupModes(onDispatchFullOnly bool) []cleanupMode {
	if onDispatchFullOnly && !full() {
		return []cleanupMode{afterRetention}
	}
	return []cleanupMode{afterRetention, onDispatch}
}

func forModes(t *testing.T, modes []cleanupMode, body func(t *testing.T, mode cleanupMode)) {
	t.Helper()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			body(t, mode)
		})
	}
}

// requireOutboxAfterDrain asserts what table holds once drained: no pending
// row in either mode; in AfterRetention the kept rows, all dispatched (those
// that no cleanup deleted); in OnDispatch no row at all, since every
// dispatched row was deleted and every parked one moved to the dead-letter
// table. It tells the modes apart, so a relay that ignored the flag fails.
func requireOutboxAfterDrain(t testing.TB, conn *pgx.Conn, table string, mode cleanupMode, kept int) {
	t.Helper()
	var total, pendingRows int
	require.NoError(t, conn.QueryRow(t.Context(), fmt.Sprintf(
		`SELECT count(*), count(*) FILTER (WHERE dispatched_at IS NULL) FROM %s`, pgx.Identifier{table}.Sanitize()),
	).Scan(&total, &pendingRows))
	require.Zero(t, pendingRows, "rows of %s pending after the drain", table)
	if mode == onDispatch {
		require.Zero(t, total, "rows left in %s by cleanup mode OnDispatch, which deletes what it dispatches", table)
		return
	}
	require.Equal(t, kept, total, "dispatched rows of %s kept by cleanup mode AfterRetention", table)
}

// outboxRowsWithIDs counts the rows of table whose id is one of ids.
func outboxRowsWithIDs(t testing.TB, conn *pgx.Conn, table string, ids []string) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), fmt.Sprintf(
		`SELECT count(*) FROM %s WHERE id::text = ANY($1)`, pgx.Identifier{table}.Sanitize()), ids).Scan(&n))
	return n
}
