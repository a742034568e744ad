package node

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// The node's two images hold, between them, every command of the repository
// but the kubectl plugin (a client), as the Dockerfile's targets do: the
// operator's from cmd/, the sample's from examples/orders/cmd/.
func TestImagesHoldEveryCommand(t *testing.T) {
	t.Parallel()
	var want []string
	for _, c := range testenv.Commands(t, testenv.RepoRoot(3)) {
		if c.Name != "kubectl-outbox" {
			want = append(want, "/"+c.Name)
		}
	}
	require.ElementsMatch(t, want, append(ProjectImage().Binaries, SampleImage().Binaries...))
	require.Contains(t, ProjectImage().Binaries, ProjectImage().Entrypoint[0])
	require.Contains(t, SampleImage().Binaries, SampleImage().Entrypoint[0])
}
