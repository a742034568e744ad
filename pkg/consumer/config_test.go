package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	host := func() (string, error) { return "host-1", nil }

	c := Config{}.withDefaults(env(nil), host)
	require.Equal(t, "jobs", c.Stream)
	require.Equal(t, "workers", c.Group)
	require.Equal(t, "host-1", c.Consumer)
	require.Equal(t, "jobs.dead", c.DeadLetterStream)
	require.Equal(t, "processed_events", c.ProcessedTable)
	require.Equal(t, 5, c.MaxDeliveries)
	require.Equal(t, time.Minute, c.MinIdle)
	require.NotNil(t, c.Logger)

	c = Config{Stream: "orders"}.withDefaults(env(map[string]string{"POD_NAME": "worker-7d9f-abcde"}), host)
	require.Equal(t, "worker-7d9f-abcde", c.Consumer, "the pod's name first")
	require.Equal(t, "orders.dead", c.DeadLetterStream)

	c = Config{Consumer: "given"}.withDefaults(env(map[string]string{"POD_NAME": "pod"}), host)
	require.Equal(t, "given", c.Consumer)

	c = Config{}.withDefaults(env(nil), func() (string, error) { return "", errors.New("no host name") })
	require.Empty(t, c.Consumer)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	host := func() (string, error) { return "", errors.New("none") }
	getenv := func(string) string { return "" }
	handler := func(context.Context, pgx.Tx, Message) error { return nil }

	require.NoError(t, Config{Consumer: "c", Handler: handler}.withDefaults(getenv, host).validate())
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no handler", Config{Consumer: "c"}, "a handler is required"},
		{"no name", Config{Handler: handler}, "no consumer name: set one, or POD_NAME"},
		{"dead-letter is the stream", Config{Stream: "s", DeadLetterStream: "s"}, "must differ"},
		{"batch", Config{BatchSize: 5000}, "batch size 5000 out of range"},
		{"block", Config{Block: -time.Second}, "block -1s below 1ms"},
		{"deliveries", Config{MaxDeliveries: -1}, "max deliveries -1 below 1"},
		{"backoff", Config{MinBackoff: time.Minute, MaxBackoff: time.Second}, "min backoff 1m0s above max backoff 1s"},
		{"table", Config{ProcessedTable: "x; DROP TABLE y"}, "invalid identifier"},
	} {
		err := tc.cfg.withDefaults(getenv, host).validate()
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}
