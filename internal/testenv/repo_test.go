package testenv_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// The operator's binaries are in cmd/, the sample application's beside them
// in examples/orders/cmd (docs/sample.md): every directory of CommandDirs is
// one binary.
func TestCommandsAreTheOperatorsAndTheSamples(t *testing.T) {
	t.Parallel()
	cmds := testenv.Commands(t, testenv.RepoRoot(2))
	require.ElementsMatch(t, []testenv.Command{
		{Name: "kubectl-outbox", Dir: "cmd/kubectl-outbox"},
		{Name: "manager", Dir: "cmd/manager"},
		{Name: "relay", Dir: "cmd/relay"},
		{Name: "orders-api", Dir: "examples/orders/cmd/orders-api"},
		{Name: "worker", Dir: "examples/orders/cmd/worker"},
	}, cmds)
	require.ElementsMatch(t, []string{"kubectl-outbox", "manager", "relay", "orders-api", "worker"}, testenv.CommandNames(cmds))
	require.Equal(t, []string{"./cmd/...", "./examples/orders/cmd/..."}, testenv.CommandPatterns())
}
