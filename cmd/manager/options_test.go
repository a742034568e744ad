package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseFlagsDefaults(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, env(nil))
	require.NoError(t, err)
	require.Equal(t, ":8443", o.metricsAddr)
	require.True(t, o.metricsSecure)
	require.False(t, o.enableHTTP2)
	require.Equal(t, ":8081", o.probeAddr)
	require.False(t, o.leaderElect)
	require.Equal(t, "ghcr.io/outbox-dev/outbox-operator:"+version, o.relayImage)
	require.Empty(t, o.watchNamespaces)
	require.Equal(t, 8, o.maxConcurrentReconciles)
	require.Equal(t, 10*time.Second, o.checks.Timeout)
	require.Equal(t, int32(2), o.pools.MaxConns)
	require.Equal(t, 5*time.Second, o.pools.StatementTimeout)
}

func TestParseFlagsRelayImage(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, env(map[string]string{"OPERATOR_IMAGE": "registry.test/op:v1"}))
	require.NoError(t, err)
	require.Equal(t, "registry.test/op:v1", o.relayImage, "the operator's own image by default")

	o, err = parseFlags(nil, env(map[string]string{"OPERATOR_IMAGE": "registry.test/op:v1", "RELAY_IMAGE": "registry.test/relay:v2"}))
	require.NoError(t, err)
	require.Equal(t, "registry.test/relay:v2", o.relayImage, "RELAY_IMAGE wins over OPERATOR_IMAGE")

	o, err = parseFlags([]string{"--relay-image=registry.test/relay:v3"}, env(map[string]string{"RELAY_IMAGE": "registry.test/relay:v2"}))
	require.NoError(t, err)
	require.Equal(t, "registry.test/relay:v3", o.relayImage, "the flag wins over the environment")
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{
		"--leader-elect", "--watch-namespaces= shop, billing ,,",
		"--max-concurrent-reconciles=8", "--backlog-check-timeout=3s", "--backlog-max-conns=4",
		"--metrics-bind-address=0", "--log-format=text",
	}, env(nil))
	require.NoError(t, err)
	require.True(t, o.leaderElect)
	require.Equal(t, []string{"shop", "billing"}, o.watchNamespaces)
	require.Equal(t, 8, o.maxConcurrentReconciles)
	require.Equal(t, 3*time.Second, o.checks.Timeout)
	require.Equal(t, int32(4), o.pools.MaxConns)
	require.Equal(t, "0", o.metricsAddr)
	require.Equal(t, "text", o.logFormat)
}

func TestParseFlagsRejects(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--max-concurrent-reconciles=0"},
		{"--backlog-check-timeout=0s"},
		{"--backlog-max-conns=0"},
		{"--relay-image="},
		{"--no-such-flag"},
		{"stray-argument"},
	} {
		_, err := parseFlags(args, env(nil))
		require.Error(t, err, "%v", args)
	}
}

func TestManagerOptions(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"--leader-elect", "--watch-namespaces=shop"}, env(nil))
	require.NoError(t, err)
	mo := managerOptions(o)
	require.True(t, mo.LeaderElection)
	require.Equal(t, leaderElectionID, mo.LeaderElectionID)
	require.True(t, mo.LeaderElectionReleaseOnCancel)
	require.Contains(t, mo.Cache.DefaultNamespaces, "shop")
	require.Len(t, mo.Cache.DefaultNamespaces, 1)
	require.NotNil(t, mo.Cache.ByObject[&appsv1.Deployment{}], "Deployments are cached by label only")

	gvks, _, err := mo.Scheme.ObjectKinds(&v1alpha1.OutboxRelay{})
	require.NoError(t, err)
	require.Equal(t, "OutboxRelay", gvks[0].Kind)
	require.Len(t, mo.Client.Cache.DisableFor, 1, "Secrets are never read through a cache")
	require.IsType(t, &corev1.Secret{}, mo.Client.Cache.DisableFor[0])
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := newLogger("info", "json", &buf)
	require.NoError(t, err)
	log.Info("Created Deployment", "name", "orders-relay")
	log.V(1).Info("Debug detail")
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Equal(t, "Created Deployment", line["msg"])
	require.Equal(t, "orders-relay", line["name"])
	require.NotContains(t, buf.String(), "Debug detail", "V(1) is debug, below info")

	_, err = newLogger("loud", "json", &buf)
	require.Error(t, err)
	_, err = newLogger("info", "xml", &buf)
	require.Error(t, err)
}

func TestRestConfigFromKubeconfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600))
	cfg, err := restConfig(options{kubeconfig: path})
	require.NoError(t, err)
	require.Equal(t, "https://127.0.0.1:6443", cfg.Host)
	require.Equal(t, float32(-1), cfg.QPS, "no client-side throttling")

	_, err = restConfig(options{kubeconfig: filepath.Join(t.TempDir(), "missing")})
	require.Error(t, err)
}
