package controller

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestRBACIsCurrent regenerates the manager's ClusterRole from the
// +kubebuilder:rbac markers with the pinned controller-gen and compares it
// with config/rbac/role.yaml.
func TestRBACIsCurrent(t *testing.T) {
	t.Parallel()
	root, out := testenv.ControllerGen(t, func(out string) []string {
		return []string{"rbac:roleName=manager-role", "paths=./api/...;./internal/...", "output:rbac:artifacts:config=" + out}
	})
	want, err := os.ReadFile(filepath.Join(out, "role.yaml"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "config/rbac/role.yaml is stale: run `make manifests`")
}
