package controller

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestRelayDeploymentMountsRedisCA(t *testing.T) {
	t.Parallel()
	relay := newRelay("ns", "orders")
	dep := RelayDeployment(relay, testImage, "hash", 1)
	require.Empty(t, dep.Spec.Template.Spec.Volumes)
	require.NotContains(t, dep.Spec.Template.Spec.Containers[0].Args, "--redis-ca-file="+redisCAMountPath+"/ca.crt")

	relay.Spec.Redis.CASecretRef = &v1alpha1.SecretKeyReference{Name: "redis-ca", Key: "ca.pem"}
	dep = RelayDeployment(relay, testImage, "hash", 1)
	ps := dep.Spec.Template.Spec
	require.Equal(t, []corev1.Volume{{Name: redisCAVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "redis-ca", Items: []corev1.KeyToPath{{Key: "ca.pem", Path: "ca.crt"}},
		DefaultMode: ps.Volumes[0].Secret.DefaultMode, Optional: ps.Volumes[0].Secret.Optional,
	}}}}, ps.Volumes)
	require.Equal(t, []corev1.VolumeMount{{Name: redisCAVolume, MountPath: redisCAMountPath, ReadOnly: true}}, ps.Containers[0].VolumeMounts)
	require.Contains(t, ps.Containers[0].Args, "--redis-ca-file=/etc/outbox-relay/redis-ca/ca.crt")
	require.Equal(t, []string{"orders-db", "orders-redis", "redis-ca"}, indexSecretNames(relay))
}

func TestRedisDurableEvent(t *testing.T) {
	t.Parallel()
	c := func(status metav1.ConditionStatus, reason v1alpha1.Reason) *metav1.Condition {
		return &metav1.Condition{Status: status, Reason: string(reason)}
	}
	pending := c(metav1.ConditionUnknown, v1alpha1.ReasonRedisCheckPending)
	durable := c(metav1.ConditionTrue, v1alpha1.ReasonRedisDurable)
	evicting := c(metav1.ConditionFalse, v1alpha1.ReasonRedisEvictionUnsafe)
	for _, tc := range []struct {
		name     string
		old, now *metav1.Condition
		want     v1alpha1.Reason
	}{
		{"pending is no news", nil, pending, ""},
		{"a first check that finds Redis durable", pending, durable, ""},
		{"a first check that finds a risk", nil, evicting, v1alpha1.ReasonRedisEvictionUnsafe},
		{"a new risk", durable, evicting, v1alpha1.ReasonRedisEvictionUnsafe},
		{"the same risk again", evicting, evicting, ""},
		{"fixed", evicting, durable, v1alpha1.ReasonRedisDurable},
	} {
		got, ok := redisDurableEvent(tc.old, tc.now)
		require.Equal(t, tc.want, got, tc.name)
		require.Equal(t, tc.want != "", ok, tc.name)
	}
	require.True(t, v1alpha1.ReasonRedisEvictionUnsafe.IsFailure())
	require.False(t, v1alpha1.ReasonRedisDurable.IsFailure())
}

// testRedisDurableCondition: the operator runs the Redis checks itself
// against a real redis-server and shows them as RedisDurable, outside
// Ready, with an Event per transition, and never the URL's password.
func testRedisDurableCondition(t *testing.T, s *suite) {
	const password = "redis-canary-8c1f"
	srv := testenv.StartRedis(t, testenv.WithAppendOnly(), testenv.WithRedisArgs(
		"--requirepass", password, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"))
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: password})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()

	ns := s.namespace(t)
	dsn, _ := database(t)
	s.createSecrets(t, ns, "orders", dsn)
	url := func(db string) string { return "redis://:" + password + "@" + srv.Addr() + "/" + db }
	s.createSecret(t, ns, "orders-redis", "url", url("0"))
	relay := newRelay(ns, "orders", withFastChecks())
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)
	s.markAvailable(t, key)

	got := s.waitCondition(t, key, v1alpha1.ConditionRedisDurable, metav1.ConditionFalse, v1alpha1.ReasonRedisEvictionUnsafe)
	c := findCondition(got, v1alpha1.ConditionRedisDurable)
	require.Contains(t, c.Message, "allkeys-lru")
	require.Contains(t, c.Message, "Fix: CONFIG SET maxmemory-policy noeviction")
	ev := s.waitEvent(t, key, v1alpha1.ReasonRedisEvictionUnsafe)
	require.Equal(t, corev1.EventTypeWarning, ev.Type)
	got = s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
	require.Equal(t, string(v1alpha1.ReasonRedisEvictionUnsafe), findCondition(got, v1alpha1.ConditionRedisDurable).Reason,
		"RedisDurable is not part of Ready")

	// Fixed by hand; the Redis checks run again with the next Secret value
	// (another database of the same server), or within a minute.
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	s.createSecret(t, ns, "orders-redis", "url", url("1"))
	s.waitCondition(t, key, v1alpha1.ConditionRedisDurable, metav1.ConditionTrue, v1alpha1.ReasonRedisDurable)
	require.Equal(t, corev1.EventTypeNormal, s.waitEvent(t, key, v1alpha1.ReasonRedisDurable).Type)

	// Persistence turned off.
	require.NoError(t, admin.ConfigSet(ctx, "appendonly", "no").Err())
	s.createSecret(t, ns, "orders-redis", "url", url("2"))
	s.waitCondition(t, key, v1alpha1.ConditionRedisDurable, metav1.ConditionFalse, v1alpha1.ReasonRedisPersistenceOff)
	require.Equal(t, corev1.EventTypeWarning, s.waitEvent(t, key, v1alpha1.ReasonRedisPersistenceOff).Type)

	// Unreachable: Unknown, not False.
	srv.Stop(t)
	s.createSecret(t, ns, "orders-redis", "url", url("3"))
	got = s.waitCondition(t, key, v1alpha1.ConditionRedisDurable, metav1.ConditionUnknown, v1alpha1.ReasonRedisUnreachable)

	raw, err := json.Marshal(got)
	require.NoError(t, err)
	require.NotContains(t, string(raw), password)
	requireNoEventMentions(t, s, key, password)
	require.NotContains(t, s.logs.String(), password)
}

// requireNoEventMentions fails when an Event about the relay holds s.
func requireNoEventMentions(t *testing.T, s *suite, key types.NamespacedName, secret string) {
	t.Helper()
	var events eventsv1.EventList
	require.NoError(t, s.c.List(context.Background(), &events, client.InNamespace(key.Namespace)))
	raw, err := json.Marshal(events)
	require.NoError(t, err)
	require.NotContains(t, string(raw), secret)
}
