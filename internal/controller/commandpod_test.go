package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

func TestRelayCommandPod(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", withTable("app.outbox"), func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.Image = "example.com/relay:1.2"
		r.Spec.Relay.NodeSelector = map[string]string{"pool": "relays"}
		r.Spec.Redis.CASecretRef = &v1alpha1.SecretKeyReference{Name: "redis-ca", Key: "ca.pem"}
	})

	pod := RelayCommandPod(relay, "default/relay:dev", []string{"dead-letters", "list"}, []string{"--output=json"}, false)
	require.Equal(t, "shop", pod.Namespace)
	require.Equal(t, "orders-dead-letters-", pod.GenerateName)
	require.Equal(t, ComponentCommand, pod.Labels[LabelComponent])
	require.Equal(t, "orders", pod.Labels[LabelInstance])
	require.NotEqual(t, ManagedByOperator, pod.Labels[LabelManagedBy], "the operator's cache and selectors leave it alone")
	require.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
	require.False(t, *pod.Spec.AutomountServiceAccountToken)
	require.True(t, *pod.Spec.SecurityContext.RunAsNonRoot)
	require.Equal(t, map[string]string{"pool": "relays"}, pod.Spec.NodeSelector)
	require.Empty(t, pod.Spec.Volumes, "no Redis CA for a command that does not talk to Redis")

	require.Len(t, pod.Spec.Containers, 1)
	c := pod.Spec.Containers[0]
	require.Equal(t, "example.com/relay:1.2", c.Image)
	require.Equal(t, []string{"/relay", "dead-letters", "list"}, c.Command)
	require.Equal(t, append(layoutArgs(relay), "--output=json"), c.Args)
	require.Contains(t, c.Args, "--table=app.outbox")
	require.Equal(t, containerSecurityContext(), c.SecurityContext)
	require.Len(t, c.Env, 1)
	require.Equal(t, "DATABASE_URL", c.Env[0].Name)
	require.Equal(t, "orders-db", c.Env[0].ValueFrom.SecretKeyRef.Name)
	require.Equal(t, "dsn", c.Env[0].ValueFrom.SecretKeyRef.Key)
	require.Empty(t, c.Env[0].Value, "the DSN never appears in the pod spec")
}

func TestRelayCommandPodWithRedis(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Redis.CASecretRef = &v1alpha1.SecretKeyReference{Name: "redis-ca", Key: "ca.pem"}
	})
	pod := RelayCommandPod(relay, "default/relay:dev", []string{"replay"}, []string{"--stream=jobs"}, true)
	c := pod.Spec.Containers[0]
	require.Equal(t, "default/relay:dev", c.Image, "the default image when relay.image is empty")
	require.Equal(t, []string{"DATABASE_URL", "REDIS_URL"}, []string{c.Env[0].Name, c.Env[1].Name})
	require.Equal(t, "orders-redis", c.Env[1].ValueFrom.SecretKeyRef.Name)
	require.Contains(t, c.Args, "--redis-ca-file="+redisCAMountPath+"/"+redisCAFileName)
	require.Equal(t, "--stream=jobs", c.Args[len(c.Args)-1])
	require.Len(t, pod.Spec.Volumes, 1)
	require.Equal(t, "redis-ca", pod.Spec.Volumes[0].Secret.SecretName)
	require.Len(t, c.VolumeMounts, 1)
}

func TestRelayCommandPodIsNotSelectedByTheDeployment(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	pod := RelayCommandPod(relay, "img", []string{"backlog"}, nil, false)
	sel := RelayDeployment(relay, "img", "hash", 1).Spec.Selector.MatchLabels
	matches := true
	for k, v := range sel {
		if pod.Labels[k] != v {
			matches = false
		}
	}
	require.False(t, matches, "the relay Deployment must not adopt a command pod")
}
