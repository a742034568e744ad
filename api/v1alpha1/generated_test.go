package v1alpha1_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestGeneratedFilesAreCurrent regenerates the CRD and the deepcopy code
// with the pinned controller-gen into a temporary directory and compares
// them with the committed files: a marker or type changed without `make
// manifests generate` fails here.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	t.Parallel()
	root, out := testenv.ControllerGen(t, func(out string) []string {
		return []string{"crd", "paths=./api/...", "output:crd:artifacts:config=" + out,
			"object:headerFile=hack/boilerplate.go.txt", "output:object:dir=" + out}
	})

	for generated, committed := range map[string]string{
		"relay.outbox.dev_outboxrelays.yaml": "config/crd/bases/relay.outbox.dev_outboxrelays.yaml",
		"zz_generated.deepcopy.go":           "api/v1alpha1/zz_generated.deepcopy.go",
	} {
		want, err := os.ReadFile(filepath.Join(out, generated))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(root, committed))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "%s is stale: run `make manifests generate`", committed)
	}
}
