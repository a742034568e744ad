package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordingTB records how reportError ends a test instead of ending it.
type recordingTB struct {
	testing.TB
	skipped, fatal string
}

func (r *recordingTB) Helper()                           {}
func (r *recordingTB) Skipf(format string, args ...any)  { r.skipped = format }
func (r *recordingTB) Fatalf(format string, args ...any) { r.fatal = format }

func TestReportErrorSkipsMissingDependencyUnlessCI(t *testing.T) {
	t.Parallel()
	_, err := findPostgresBin([]string{t.TempDir(), ""})
	require.ErrorContains(t, err, "hack/install-test-deps.sh")
	require.ErrorContains(t, err, "apt-get install -y postgresql redis-server")

	local := &recordingTB{}
	reportError(local, err, false)
	require.NotEmpty(t, local.skipped)
	require.Empty(t, local.fatal)

	ci := &recordingTB{}
	reportError(ci, err, true)
	require.Empty(t, ci.skipped)
	require.NotEmpty(t, ci.fatal)

	other := &recordingTB{}
	reportError(other, errors.New("boom"), false)
	require.Empty(t, other.skipped, "only a missing dependency skips")
	require.NotEmpty(t, other.fatal)
}

func TestFindPostgresBinNeedsInitdbAndPostgres(t *testing.T) {
	t.Parallel()
	onlyInitdb, both := t.TempDir(), t.TempDir()
	for _, path := range []string{
		filepath.Join(onlyInitdb, "initdb"),
		filepath.Join(both, "initdb"),
		filepath.Join(both, "postgres"),
	} {
		require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755))
	}
	dir, err := findPostgresBin([]string{onlyInitdb, both})
	require.NoError(t, err)
	require.Equal(t, both, dir)
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:p@db:5432/postgres?sslmode=disable": "postgres://u:p@db:5432/t_x_000001?sslmode=disable",
		"postgresql://u@db": "postgresql://u@db/t_x_000001",
	} {
		got, err := withDatabase(in, "t_x_000001")
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := withDatabase("host=db user=u dbname=postgres", "t_x_000001")
	require.ErrorContains(t, err, "must be a postgres:// URL")
}
