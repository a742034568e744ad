package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// RepoRoot is the repository's root, seen from a test package that is depth
// directories below it (a test's working directory is its package's).
func RepoRoot(depth int) string {
	parts := make([]string, depth)
	for i := range parts {
		parts[i] = ".."
	}
	dir, err := filepath.Abs(filepath.Join(parts...))
	if err != nil {
		panic(err)
	}
	return dir
}

// Commands are the directories of cmd/ below root: one binary each, all of
// them in the image. It fails the test unless manager and relay are among
// them (the controller runs /relay from the operator's image).
func Commands(t testing.TB, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatalf("reading cmd/: %v", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	for _, must := range []string{"manager", "relay"} {
		found := false
		for _, c := range out {
			found = found || c == must
		}
		if !found {
			t.Fatalf("cmd/%s is missing: the image holds the manager and the relay (%v)", must, out)
		}
	}
	return out
}
