package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// Missing ends a test whose dependency (a tool, a package, root) is missing:
// it skips it with the message, which says how to get the dependency, or,
// with CI=true, fails it: in CI a missing dependency is a failure.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// envtestHint says how to get the API server binaries.
const envtestHint = "envtest needs kube-apiserver and etcd: run `make test`, or " +
	"export KUBEBUILDER_ASSETS=\"$(hack/setup-envtest.sh)\" (it downloads them, or builds them from Go modules)"

// RequireEnvtestAssets ends the test as Missing does when the API server
// binaries of envtest are not in KUBEBUILDER_ASSETS (or envtest's default
// directory).
func RequireEnvtestAssets(t testing.TB) {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = "/usr/local/kubebuilder/bin"
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			Missing(t, "%s (missing %s)", envtestHint, filepath.Join(dir, bin))
		}
	}
}
