package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

const testImage = "example.test/outbox-operator:v1"

// requireRestricted checks a pod spec against the restricted Pod Security
// Standard and the operator's own rules (no token, secrets only by reference).
func requireRestricted(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	require.Equal(t, ptr.To(false), pod.AutomountServiceAccountToken)
	require.Equal(t, ptr.To(false), pod.EnableServiceLinks)
	require.NotNil(t, pod.SecurityContext)
	require.Equal(t, ptr.To(true), pod.SecurityContext.RunAsNonRoot)
	require.Equal(t, ptr.To[int64](65532), pod.SecurityContext.RunAsUser)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SecurityContext.SeccompProfile.Type)
	require.False(t, pod.HostNetwork || pod.HostPID || pod.HostIPC)
	require.Empty(t, pod.Volumes)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.Equal(t, ptr.To(false), sc.AllowPrivilegeEscalation)
	require.Equal(t, ptr.To(false), sc.Privileged)
	require.Equal(t, ptr.To(true), sc.ReadOnlyRootFilesystem)
	require.Equal(t, ptr.To(true), sc.RunAsNonRoot)
	require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	require.Empty(t, sc.Capabilities.Add)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
	for _, e := range c.Env {
		require.Empty(t, e.Value, "env %s must come from a Secret, not a literal", e.Name)
		require.NotNil(t, e.ValueFrom.SecretKeyRef, "env %s", e.Name)
	}
	require.Empty(t, c.EnvFrom)
}

func TestRelayDeployment(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", withStream("orders.events"))
	dep := RelayDeployment(relay, testImage, "abc123", 3)

	require.Equal(t, "orders-relay", dep.Name)
	require.Equal(t, "shop", dep.Namespace)
	want := map[string]string{
		"app.kubernetes.io/name":       "outbox-relay",
		"app.kubernetes.io/instance":   "orders",
		"app.kubernetes.io/component":  "relay",
		"app.kubernetes.io/managed-by": "outbox-operator",
	}
	require.Equal(t, want, dep.Labels)
	require.Equal(t, want, dep.Spec.Template.Labels)
	require.Equal(t, map[string]string{
		"app.kubernetes.io/name":      "outbox-relay",
		"app.kubernetes.io/instance":  "orders",
		"app.kubernetes.io/component": "relay",
	}, dep.Spec.Selector.MatchLabels)
	require.Equal(t, ptr.To[int32](3), dep.Spec.Replicas)
	require.Equal(t, "abc123", dep.Spec.Template.Annotations[AnnotationSecretHash])
	require.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, dep.Spec.Strategy.Type)

	pod := dep.Spec.Template.Spec
	requireRestricted(t, pod)
	c := pod.Containers[0]
	require.Equal(t, "relay", c.Name)
	require.Equal(t, testImage, c.Image)
	require.Equal(t, []string{"/relay", "run"}, c.Command)
	require.Equal(t, []string{
		"--table=outbox_events",
		"--id-column=id",
		"--event-type-column=event_type",
		"--payload-column=payload",
		"--created-at-column=created_at",
		"--dispatched-at-column=dispatched_at",
		"--log-level=info",
		"--log-format=json",
		"--stream=orders.events",
		"--batch-size=500",
		"--poll-interval=500ms",
		"--metrics-bind-address=:8080",
		"--health-probe-bind-address=:8081",
	}, c.Args)
	require.Equal(t, []corev1.EnvVar{
		{Name: "DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "orders-db"}, Key: "dsn", Optional: ptr.To(false)}}},
		{Name: "REDIS_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "orders-redis"}, Key: "url", Optional: ptr.To(false)}}},
	}, c.Env)
	require.Equal(t, []corev1.ContainerPort{
		{Name: "metrics", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
	}, c.Ports)
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, intstr.FromString("health"), c.LivenessProbe.HTTPGet.Port)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, intstr.FromString("health"), c.ReadinessProbe.HTTPGet.Port)
}

func TestRelayDeploymentFollowsSpec(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Postgres.Table = "app.events"
		r.Spec.Postgres.Columns = v1alpha1.OutboxColumns{ID: "event_id", DispatchedAt: "sent_at"}
		r.Spec.Redis.DeadLetterStream = "orders.dlq"
		r.Spec.Relay = v1alpha1.RelaySpec{
			Image:            "example.test/relay:v2",
			ImagePullPolicy:  corev1.PullAlways,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
			BatchSize:        2000,
			BatchBytes:       ptr.To(resource.MustParse("4Mi")),
			PollInterval:     &metav1.Duration{Duration: 2 * time.Second},
			LogLevel:         "debug",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			},
			NodeSelector: map[string]string{"pool": "relays"},
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
			Affinity:     &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}},
		}
	})
	dep := RelayDeployment(relay, testImage, "h", 1)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	require.Equal(t, "example.test/relay:v2", c.Image, "relay.image wins over the operator's default")
	require.Equal(t, corev1.PullAlways, c.ImagePullPolicy)
	require.Equal(t, []corev1.LocalObjectReference{{Name: "regcred"}}, pod.ImagePullSecrets)
	require.Equal(t, resource.MustParse("100m"), c.Resources.Requests[corev1.ResourceCPU])
	require.Equal(t, map[string]string{"pool": "relays"}, pod.NodeSelector)
	require.Len(t, pod.Tolerations, 1)
	require.NotNil(t, pod.Affinity.NodeAffinity)
	require.Subset(t, c.Args, []string{
		"--table=app.events", "--id-column=event_id", "--dispatched-at-column=sent_at",
		"--dead-letter-stream=orders.dlq", "--batch-size=2000", "--batch-bytes=4194304", "--poll-interval=2s", "--log-level=debug",
	})

	// The builder copies: changing its output leaves the spec alone.
	pod.NodeSelector["pool"] = "changed"
	c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("1")
	pod.Tolerations[0].Key = "changed"
	require.Equal(t, "relays", relay.Spec.Relay.NodeSelector["pool"])
	require.Equal(t, resource.MustParse("100m"), relay.Spec.Relay.Resources.Requests[corev1.ResourceCPU])
	require.Equal(t, "dedicated", relay.Spec.Relay.Tolerations[0].Key)
}

func TestRelayDeploymentOrdering(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	for _, a := range RelayDeployment(relay, testImage, "h", 1).Spec.Template.Spec.Containers[0].Args {
		require.NotContains(t, a, "--ordering", "the default adds no flag, so upgrades do not roll relays")
	}
	relay.Spec.Ordering = v1alpha1.OrderingStrict
	require.Contains(t, RelayDeployment(relay, testImage, "h", 1).Spec.Template.Spec.Containers[0].Args, "--ordering=Strict")
	relay.Spec.Ordering = v1alpha1.OrderingPerKey
	relay.Spec.Postgres.Columns.Key = "aggregate_id"
	args := RelayDeployment(relay, testImage, "h", 1).Spec.Template.Spec.Containers[0].Args
	require.Subset(t, args, []string{"--ordering=PerKey", "--key-column=aggregate_id"})
}

func TestRelayDeploymentIsDeterministic(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders")
	a, err := specHash(nil, RelayDeployment(relay, testImage, "h", 2).Spec)
	require.NoError(t, err)
	b, err := specHash(nil, RelayDeployment(relay, testImage, "h", 2).Spec)
	require.NoError(t, err)
	require.Equal(t, a, b)
	c, err := specHash(nil, RelayDeployment(relay, testImage, "other", 2).Spec)
	require.NoError(t, err)
	require.NotEqual(t, a, c, "a new secret hash changes the spec hash")
}

func TestCleanupCronJob(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Cleanup = v1alpha1.CleanupSpec{
			Schedule:  "*/5 * * * *",
			Retention: &metav1.Duration{Duration: 24 * time.Hour},
			BatchSize: 250,
			Suspend:   true,
		}
	})
	cj := CleanupCronJob(relay, testImage)
	require.Equal(t, "orders-cleanup", cj.Name)
	require.Equal(t, "shop", cj.Namespace)
	require.Equal(t, "cleanup", cj.Labels[LabelComponent])
	require.Equal(t, "*/5 * * * *", cj.Spec.Schedule)
	require.Equal(t, batchv1.ForbidConcurrent, cj.Spec.ConcurrencyPolicy)
	require.Equal(t, ptr.To(true), cj.Spec.Suspend)
	require.Equal(t, "cleanup", cj.Spec.JobTemplate.Spec.Template.Labels[LabelComponent])

	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	requireRestricted(t, pod)
	require.Equal(t, corev1.RestartPolicyNever, pod.RestartPolicy)
	c := pod.Containers[0]
	require.Equal(t, testImage, c.Image)
	require.Equal(t, []string{"/relay", "cleanup"}, c.Command)
	require.Equal(t, []string{
		"--table=outbox_events",
		"--id-column=id",
		"--event-type-column=event_type",
		"--payload-column=payload",
		"--created-at-column=created_at",
		"--dispatched-at-column=dispatched_at",
		"--log-level=info",
		"--log-format=json",
		"--retention=24h0m0s",
		"--batch-size=250",
	}, c.Args)
	require.Len(t, c.Env, 1, "cleanup needs the DSN only")
	require.Equal(t, "DATABASE_URL", c.Env[0].Name)
	require.Equal(t, "orders-db", c.Env[0].ValueFrom.SecretKeyRef.Name)
	require.Nil(t, c.LivenessProbe)
	require.Empty(t, c.Ports)
}

func TestCleanupCronJobDefaults(t *testing.T) {
	t.Parallel()
	cj := CleanupCronJob(newRelay("shop", "orders"), testImage)
	require.Equal(t, "17 * * * *", cj.Spec.Schedule)
	require.Equal(t, ptr.To(false), cj.Spec.Suspend)
	require.Contains(t, cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, "--retention=72h0m0s")
	require.Contains(t, cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, "--batch-size=1000")
}

func TestStreamArgs(t *testing.T) {
	t.Parallel()
	relay := &v1alpha1.OutboxRelay{}
	require.Empty(t, streamArgs(relay), "nothing set: no flag, no rollout on upgrade")
	relay.Spec.Redis.WaitReplicas = 1
	relay.Spec.Redis.WaitTimeout = &metav1.Duration{Duration: 500 * time.Millisecond}
	relay.Spec.Redis.Trim = &v1alpha1.TrimSpec{MaxLen: ptr.To[int64](1000), MaxAge: &metav1.Duration{Duration: time.Hour}}
	relay.Spec.Redis.AutoReplay = true
	require.Equal(t, []string{"--wait-replicas=1", "--wait-timeout=500ms", "--trim-max-len=1000", "--trim-max-age=1h0m0s",
		"--auto-replay", "--auto-replay-max-window=72h0m0s"}, streamArgs(relay))
}

// TestRelayPodExtras: what spec.relay adds to the pods (labels, annotations,
// service account, priority class, topology spread, env, volumes and
// mounts) reaches the relay, cleanup and command pods alike, never replaces
// what the operator sets, and keeps the restricted security context.
func TestRelayPodExtras(t *testing.T) {
	t.Parallel()
	relay := newRelay("shop", "orders", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.PodMetadata = &v1alpha1.PodMetadata{
			Labels:      map[string]string{"team": "payments", LabelComponent: "mine"},
			Annotations: map[string]string{"sidecar.istio.io/inject": "false", annotationDefaultContainer: "mine"},
		}
		r.Spec.Relay.ServiceAccountName = "relay-identity"
		r.Spec.Relay.PriorityClassName = "outbox-critical"
		r.Spec.Relay.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway,
		}}
		r.Spec.Relay.Env = []corev1.EnvVar{
			{Name: "PGSSLROOTCERT", Value: "/etc/pg-ca/ca.crt"},
			{Name: "RELAY_PUBLISH_TIMEOUT", Value: "10s"},
			{Name: "DATABASE_URL", Value: "postgres://sneaky"}, // admission refuses it; the builder too
		}
		r.Spec.Relay.Volumes = []corev1.Volume{{Name: "pg-ca", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: "pg-ca"},
		}}}
		r.Spec.Relay.VolumeMounts = []corev1.VolumeMount{{Name: "pg-ca", MountPath: "/etc/pg-ca", ReadOnly: true}}
	})
	dep := RelayDeployment(relay, testImage, "h", 1)
	cj := CleanupCronJob(relay, testImage)
	cmd := RelayCommandPod(relay, testImage, []string{"backlog"}, nil, false)
	for name, tmpl := range map[string]struct {
		meta metav1.ObjectMeta
		pod  corev1.PodSpec
	}{
		"relay":   {dep.Spec.Template.ObjectMeta, dep.Spec.Template.Spec},
		"cleanup": {cj.Spec.JobTemplate.Spec.Template.ObjectMeta, cj.Spec.JobTemplate.Spec.Template.Spec},
		"command": {cmd.ObjectMeta, cmd.Spec},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, "payments", tmpl.meta.Labels["team"])
			require.NotEqual(t, "mine", tmpl.meta.Labels[LabelComponent], "the operator's labels win")
			require.Equal(t, "false", tmpl.meta.Annotations["sidecar.istio.io/inject"])
			require.NotEqual(t, "mine", tmpl.meta.Annotations[annotationDefaultContainer], "the operator's annotations win")
			pod := tmpl.pod
			require.Equal(t, "relay-identity", pod.ServiceAccountName)
			require.Equal(t, ptr.To(true), pod.AutomountServiceAccountToken, "the token is mounted for a named service account")
			require.Equal(t, "outbox-critical", pod.PriorityClassName)
			require.Len(t, pod.TopologySpreadConstraints, 1)
			require.Equal(t, []corev1.Volume{relay.Spec.Relay.Volumes[0]}, pod.Volumes)
			c := pod.Containers[0]
			require.Equal(t, relay.Spec.Relay.VolumeMounts, c.VolumeMounts)
			names := map[string]int{}
			for _, e := range c.Env {
				names[e.Name]++
				if e.Name == "DATABASE_URL" {
					require.NotNil(t, e.ValueFrom, "DATABASE_URL stays the operator's secretKeyRef")
				}
			}
			require.Equal(t, 1, names["DATABASE_URL"])
			require.Equal(t, 1, names["PGSSLROOTCERT"])
			require.Equal(t, 1, names["RELAY_PUBLISH_TIMEOUT"])
			require.Equal(t, containerSecurityContext(), c.SecurityContext, "still restricted")
			require.Equal(t, podSecurityContext(), pod.SecurityContext)
		})
	}
	// The builders copy: changing their output leaves the spec alone.
	dep.Spec.Template.Spec.Volumes[0].Secret.SecretName = "changed"
	dep.Spec.Template.Spec.Containers[0].VolumeMounts[0].MountPath = "/changed"
	dep.Spec.Template.Labels["team"] = "changed"
	require.Equal(t, "pg-ca", relay.Spec.Relay.Volumes[0].Secret.SecretName)
	require.Equal(t, "/etc/pg-ca", relay.Spec.Relay.VolumeMounts[0].MountPath)
	require.Equal(t, "payments", relay.Spec.Relay.PodMetadata.Labels["team"])

	// Without a service account: no token, as before.
	plain := RelayDeployment(newRelay("shop", "orders"), testImage, "h", 1)
	require.Equal(t, ptr.To(false), plain.Spec.Template.Spec.AutomountServiceAccountToken)
	require.Empty(t, plain.Spec.Template.Spec.ServiceAccountName)
}
