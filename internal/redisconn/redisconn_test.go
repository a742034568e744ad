package redisconn

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url    string
		kind   Kind
		tls    bool
		addrs  []string
		master string
	}{
		{"redis://127.0.0.1:6379/0", Single, false, []string{"127.0.0.1:6379"}, ""},
		{"rediss://user:pw@redis.example:6380/2", Single, true, []string{"redis.example:6380"}, ""},
		{"unix:///run/redis.sock", Single, false, []string{"/run/redis.sock"}, ""},
		{"redis-sentinel://s1:26379/0?master_name=mymaster&addr=s2:26379&addr=s3:26379", Sentinel, false,
			[]string{"s1:26379", "s2:26379", "s3:26379"}, "mymaster"},
		{"rediss-sentinel://relay:pw@s1?master_name=m", Sentinel, true, []string{"s1:26379"}, "m"},
		{"redis-cluster://n1:7000?addr=n2:7000&addr=n3:7000", Cluster, false, []string{"n1:7000", "n2:7000", "n3:7000"}, ""},
		{"rediss-cluster://u:p@n1:7000", Cluster, true, []string{"n1:7000"}, ""},
	} {
		got, err := Parse(tc.url)
		require.NoError(t, err, tc.url)
		require.Equal(t, tc.kind, got.Kind, tc.url)
		require.Equal(t, tc.tls, got.TLS, tc.url)
		require.Equal(t, tc.addrs, got.Addrs, tc.url)
		require.Equal(t, tc.master, got.MasterName, tc.url)
		require.True(t, Valid(tc.url))
	}
}

func TestParseCredentials(t *testing.T) {
	t.Parallel()
	got, err := Parse("redis-sentinel://relay:s3cret@s1:26379/1?master_name=m&sentinel_username=sen&sentinel_password=spw")
	require.NoError(t, err)
	require.Equal(t, "relay", got.sentinel.Username)
	require.Equal(t, "s3cret", got.sentinel.Password)
	require.Equal(t, "sen", got.sentinel.SentinelUsername)
	require.Equal(t, "spw", got.sentinel.SentinelPassword)
	require.Equal(t, 1, got.sentinel.DB)
	got, err = Parse("redis-cluster://relay:s3cret@n1:7000")
	require.NoError(t, err)
	require.Equal(t, "relay", got.cluster.Username)
	require.Equal(t, "s3cret", got.cluster.Password)
}

func TestParseRefusesWithoutEchoingTheURL(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"", "redis://", "http://u:s3cret@h:1", "redis-sentinel://u:s3cret@s1:26379",
		"redis-sentinel://u:s3cret@s1:26379?master_name=m&bogus=1", "redis-sentinel://u:s3cret@s1/x/y?master_name=m",
		"redis-cluster://u:s3cret@n1:7000?addr=nope", "redis://u:s3cret@h:1/notadb", "unix://",
	} {
		_, err := Parse(bad)
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), "s3cret")
		require.False(t, Valid(bad))
	}
}

// TestParseNeverEchoesAQueryParameter: a sentinel password with an
// unencoded '&' (or a ':' typed for '=') splits into parameters of its own,
// whose names are parts of the password; the relay prints Parse's error.
func TestParseNeverEchoesAQueryParameter(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"redis-sentinel://u:pw@s1:26379?master_name=m&sentinel_password=s3cret&canarytail",
		"redis-sentinel://u:pw@s1:26379?master_name=m&sentinel_password=s3cret&canary=tail",
		"redis-sentinel://u:pw@s1:26379?master_name=m&sentinel_password:s3cretcanarytail",
	} {
		_, err := Parse(bad)
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), "canary", bad)
	}
}

func TestClientKinds(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]any{
		"redis://127.0.0.1:1/0":                        &redis.Client{},
		"redis-sentinel://127.0.0.1:1?master_name=m":   &redis.Client{},
		"redis-cluster://127.0.0.1:1?addr=127.0.0.1:2": &redis.ClusterClient{},
	} {
		c, _, err := New(url, Options{})
		require.NoError(t, err)
		require.IsType(t, want, c, url)
		require.NoError(t, c.Close())
	}
}

func TestCA(t *testing.T) {
	t.Parallel()
	_, _, err := New("redis://127.0.0.1:1/0", Options{CA: []byte("x")})
	require.ErrorContains(t, err, "not a TLS one")
	_, _, err = New("rediss://127.0.0.1:1/0", Options{CA: []byte("not pem")})
	require.ErrorContains(t, err, "no PEM certificate")
	_, _, err = New("rediss://127.0.0.1:1/0", Options{CAFile: filepath.Join(t.TempDir(), "missing.pem")})
	require.ErrorContains(t, err, "reading the Redis CA file")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, _, err = New("rediss://127.0.0.1:1/0", Options{CAFile: empty})
	require.True(t, strings.Contains(err.Error(), "no PEM"))
}
