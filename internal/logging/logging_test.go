package logging

import (
	"bytes"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

func TestLogger(t *testing.T) {
	t.Parallel()
	var f Flags
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--log-level=debug", "--log-format=text"}))
	var out bytes.Buffer
	log, err := f.Logger(&out)
	require.NoError(t, err)
	log.Debug("Started", "k", "v")
	require.Contains(t, out.String(), `level=DEBUG msg=Started k=v`)

	f = Flags{Level: "info", Format: "json"}
	log, err = f.Logger(&out)
	require.NoError(t, err)
	log.Info("Stopped")
	require.Contains(t, out.String(), `"msg":"Stopped"`)

	_, err = (&Flags{Level: "loud", Format: "json"}).Logger(&out)
	require.ErrorContains(t, err, "--log-level")
	_, err = (&Flags{Level: "info", Format: "xml"}).Logger(&out)
	require.ErrorContains(t, err, `--log-format "xml": must be json or text`)
}
