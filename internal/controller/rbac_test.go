package controller

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRBACIsCurrent regenerates the manager's ClusterRole from the
// +kubebuilder:rbac markers with the pinned controller-gen and compares it
// with config/rbac/role.yaml.
func TestRBACIsCurrent(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	cg := filepath.Join(root, "bin", "controller-gen")
	if _, err := os.Stat(cg); err != nil {
		msg := "bin/controller-gen is missing: run `make controller-gen` (make test installs it)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	out := t.TempDir()
	cmd := exec.Command(cg, "rbac:roleName=manager-role", "paths=./...", "output:rbac:artifacts:config="+out)
	cmd.Dir = root
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "controller-gen: %s", msg)
	want, err := os.ReadFile(filepath.Join(out, "role.yaml"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "config/rbac/role.yaml is stale: run `make manifests`")
}
