package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// ControllerGen runs the project's pinned bin/controller-gen from the
// repository root, with the arguments args builds for a fresh output
// directory, and returns the root and that directory. Tests use it to check
// that generated files are current. A missing controller-gen fails the test
// in CI and skips it elsewhere, with the command that installs it.
func ControllerGen(t testing.TB, args func(out string) []string) (root, out string) {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("testenv: cannot locate the repository root")
	}
	root = filepath.Join(filepath.Dir(file), "..", "..")
	cg := filepath.Join(root, "bin", "controller-gen")
	if _, err := os.Stat(cg); err != nil {
		Missing(t, "bin/controller-gen is missing: run `make controller-gen` (make test installs it)")
	}
	out = t.TempDir()
	cmd := exec.Command(cg, args(out)...)
	cmd.Dir = root
	// The product module alone, as `make manifests` runs it: in the Go
	// workspace controller-gen's loader refuses ./... (Makefile).
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, msg)
	}
	return root, out
}
