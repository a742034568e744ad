package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

func TestSecretCache(t *testing.T) {
	t.Parallel()
	c := newSecretCache()
	db := types.NamespacedName{Namespace: "ns", Name: "db"}
	relayA := types.NamespacedName{Namespace: "ns", Name: "a"}
	relayB := types.NamespacedName{Namespace: "ns", Name: "b"}

	_, ok := c.get(db, "1", "dsn")
	require.False(t, ok, "nothing cached yet")

	c.put(db, "1", map[string][]byte{"dsn": []byte("postgres://x"), "other": []byte("unrelated")}, "dsn", "missing")
	c.use(relayA, db)
	v, ok := c.get(db, "1", "dsn")
	require.True(t, ok)
	require.Equal(t, "postgres://x", string(v))
	v, ok = c.get(db, "1", "missing")
	require.True(t, ok, "a missing key is remembered as missing")
	require.Nil(t, v)
	_, ok = c.get(db, "1", "other")
	require.False(t, ok, "keys no relay asked for are not kept")
	_, ok = c.get(db, "2", "dsn")
	require.False(t, ok, "a new resourceVersion is a miss")

	// A new resourceVersion replaces the values.
	c.put(db, "2", map[string][]byte{"dsn": []byte("postgres://y")}, "dsn")
	_, ok = c.get(db, "2", "missing")
	require.False(t, ok)

	c.use(relayB, db)
	c.forget(relayA)
	require.Equal(t, 1, c.len(), "relay b still uses the Secret")
	c.use(relayB) // b now references other Secrets
	require.Equal(t, 0, c.len(), "no relay uses the Secret: its values are dropped")

	c.put(db, "3", map[string][]byte{"dsn": []byte("z")}, "dsn")
	c.use(relayA, db)
	c.drop(db)
	_, ok = c.get(db, "3", "dsn")
	require.False(t, ok, "a deleted Secret is dropped")
}
