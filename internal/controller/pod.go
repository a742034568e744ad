package controller

import (
	"cmp"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// The relay program's contract (docs/relay-cli.md): the image holds it at
// /relay; secrets come only from these environment variables.
const (
	relayBinary    = "/relay"
	envDatabaseURL = "DATABASE_URL"
	envRedisURL    = "REDIS_URL"

	// nonRootUID is the user the pods run as (distroless "nonroot").
	nonRootUID int64 = 65532

	metricsPort     int32 = 8080
	healthPort      int32 = 8081
	metricsPortName       = "metrics"
	healthPortName        = "health"
)

// layoutArgs are the flags every relay subcommand takes: the outbox table,
// its columns and the logging format.
func layoutArgs(relay *v1alpha1.OutboxRelay) []string {
	c := relay.Spec.Postgres.Columns.GetColumns()
	args := []string{
		"--table=" + relay.Spec.Postgres.GetTable(),
		"--id-column=" + c.ID,
		"--event-type-column=" + c.EventType,
		"--payload-column=" + c.Payload,
		"--created-at-column=" + c.CreatedAt,
		"--dispatched-at-column=" + c.DispatchedAt,
		"--log-level=" + relay.Spec.Relay.GetLogLevel(),
		"--log-format=json",
	}
	if c.Key != "" {
		args = append(args, "--key-column="+c.Key)
	}
	return args
}

// secretEnv is an environment variable read from a Secret key: the only way
// a secret reaches a pod.
func secretEnv(name string, ref v1alpha1.SecretKeyReference) corev1.EnvVar {
	return corev1.EnvVar{
		Name: name,
		ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name},
			Key:                  ref.Key,
			Optional:             ptr.To(false),
		}},
	}
}

// podSecurityContext meets the restricted Pod Security Standard.
func podSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(nonRootUID),
		RunAsGroup:     ptr.To(nonRootUID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// containerSecurityContext meets the restricted Pod Security Standard and
// makes the root filesystem read-only (the relay writes nothing to disk).
func containerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Privileged:               ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// podSpec is what the relay and cleanup pods share: security, scheduling,
// no service-account token (the relay never talks to the API server) and no
// service links (their environment would only be noise).
func podSpec(relay *v1alpha1.OutboxRelay, container corev1.Container) corev1.PodSpec {
	spec := &relay.Spec.Relay
	container.ImagePullPolicy = spec.ImagePullPolicy
	container.Resources = *spec.Resources.DeepCopy()
	container.SecurityContext = containerSecurityContext()
	container.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	ps := corev1.PodSpec{
		Containers:                   []corev1.Container{container},
		AutomountServiceAccountToken: ptr.To(false),
		EnableServiceLinks:           ptr.To(false),
		SecurityContext:              podSecurityContext(),
		ImagePullSecrets:             cloneSlice(spec.ImagePullSecrets),
		Tolerations:                  cloneTolerations(spec.Tolerations),
	}
	if len(spec.NodeSelector) > 0 {
		ps.NodeSelector = make(map[string]string, len(spec.NodeSelector))
		for k, v := range spec.NodeSelector {
			ps.NodeSelector[k] = v
		}
	}
	if spec.Affinity != nil {
		ps.Affinity = spec.Affinity.DeepCopy()
	}
	return ps
}

// relayImage is the image of the relay pods: the OutboxRelay's own, else the
// operator's default.
func relayImage(relay *v1alpha1.OutboxRelay, defaultImage string) string {
	return cmp.Or(relay.Spec.Relay.Image, defaultImage)
}

func cloneSlice[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return append([]T(nil), s...)
}

func cloneTolerations(s []corev1.Toleration) []corev1.Toleration {
	if len(s) == 0 {
		return nil
	}
	out := make([]corev1.Toleration, len(s))
	for i := range s {
		s[i].DeepCopyInto(&out[i])
	}
	return out
}

// durationFlag formats a flag whose value is a Go duration.
func durationFlag(name string, d fmt.Stringer) string { return "--" + name + "=" + d.String() }
