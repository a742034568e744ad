package controller

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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

// secretGets counts the Secrets read whole from the API server.
type secretGets struct {
	client.Reader
	n int
}

func (r *secretGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok {
		r.n++
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A Secret that holds both the DSN and the Redis URL is read once, and then
// not again while its resourceVersion stays.
func TestResolveSecretsReadsASharedSecretOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(newTestScheme()).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shared"},
		Data:       map[string][]byte{"dsn": []byte("postgres://app@db:5432/app"), "url": []byte("redis://cache:6379/0")},
	}).Build()
	api := &secretGets{Reader: c}
	r := &OutboxRelayReconciler{APIReader: api, MetadataReader: c, secretCache: newSecretCache()}
	relay := newRelay("ns", "orders")
	relay.Spec.Postgres.DSNSecretRef.Name = "shared"
	relay.Spec.Redis.URLSecretRef.Name = "shared"

	for range 2 {
		res, f, err := r.resolveSecrets(ctx, relay)
		require.NoError(t, err)
		require.Nil(t, f)
		require.Equal(t, "postgres://app@db:5432/app", res.dsn)
		require.Equal(t, "redis://cache:6379/0", res.redisURL)
	}
	require.Equal(t, 1, api.n, "one read for both keys, then the cache")
}
