package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

func TestValidRedisURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"redis://localhost:6379/0":    true,
		"rediss://:pw@redis.example":  true,
		"unix:///run/redis.sock":      true,
		"redis://":                    false,
		"http://localhost:6379":       false,
		"localhost:6379":              false,
		"postgres://u:p@localhost/db": false,
		"redis://%zz":                 false,
	} {
		require.Equal(t, want, validRedisURL(in), in)
	}
}

func TestSecretHash(t *testing.T) {
	t.Parallel()
	relay := newRelay("ns", "orders")
	relay.UID = types.UID("uid-1")
	fields := []secretField{
		{"dsn", v1alpha1.SecretKeyReference{Name: "db", Key: "dsn"}},
		{"url", v1alpha1.SecretKeyReference{Name: "redis", Key: "url"}},
	}
	h := secretHash(relay, fields, []string{"postgres://a", "redis://b"})
	require.Len(t, h, 32)
	require.Equal(t, h, secretHash(relay, fields, []string{"postgres://a", "redis://b"}))
	require.NotEqual(t, h, secretHash(relay, fields, []string{"postgres://a2", "redis://b"}), "a new DSN rolls the pods")
	require.NotEqual(t, h, secretHash(relay, fields, []string{"postgres://a", "redis://b2"}), "a new URL rolls the pods")

	other := relay.DeepCopy()
	other.UID = "uid-2"
	require.NotEqual(t, h, secretHash(other, fields, []string{"postgres://a", "redis://b"}), "keyed by the relay")
}
