package testenv

import (
	"os"
	"path"
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

// CommandDirs are the directories below the repository's root that hold one
// binary per subdirectory: the operator's (cmd: manager, relay,
// kubectl-outbox) and the sample application's (examples/orders/cmd:
// orders-api, worker), each built into an image of its own but the kubectl
// plugin (a client).
var CommandDirs = []string{"cmd", "examples/orders/cmd"}

// CommandPatterns are the go build patterns of CommandDirs: ./cmd/... and
// ./examples/orders/cmd/....
func CommandPatterns() []string {
	out := make([]string, len(CommandDirs))
	for i, d := range CommandDirs {
		out[i] = "./" + d + "/..."
	}
	return out
}

// Command is one binary of the repository.
type Command struct {
	// Name is the binary's name, its directory's: relay.
	Name string
	// Dir is its package's directory below the root, slash-separated:
	// cmd/relay.
	Dir string
}

// Commands are the binaries of CommandDirs below root, in that order. It
// fails the test unless manager and relay are among them (the controller runs
// /relay from the operator's image).
func Commands(t testing.TB, root string) []Command {
	t.Helper()
	var out []Command
	for _, dir := range CommandDirs {
		entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
		if err != nil {
			t.Fatalf("reading %s/: %v", dir, err)
		}
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, Command{Name: e.Name(), Dir: path.Join(dir, e.Name())})
			}
		}
	}
	for _, must := range []string{"cmd/manager", "cmd/relay"} {
		found := false
		for _, c := range out {
			found = found || c.Dir == must
		}
		if !found {
			t.Fatalf("%s is missing: the operator's image holds the manager and the relay (%v)", must, out)
		}
	}
	return out
}

// CommandNames are the names of cmds.
func CommandNames(cmds []Command) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.Name
	}
	return out
}
