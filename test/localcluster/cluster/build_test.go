package cluster

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// up builds every command of the repository into <state>/bin, the sample
// application's (examples/orders/cmd) included: the node runs the pods of
// both images from there.
func TestBuildCompilesEveryCommand(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(3)
	cmd := exec.Command("go", append([]string{"list", "-f", `{{if eq .Name "main"}}{{.Dir}}{{end}}`}, buildPackages...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v", buildPackages)
	mains := strings.Fields(string(out))
	for _, c := range testenv.Commands(t, root) {
		require.Contains(t, mains, filepath.Join(root, filepath.FromSlash(c.Dir)), "up does not build %s", c.Dir)
	}
	require.Contains(t, mains, filepath.Join(root, "hack", "localcluster"), "up does not build the node's command")
}
