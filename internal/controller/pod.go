package controller

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// no service links (their environment would only be noise), and what
// spec.relay adds: env, volumes and mounts, a service account, a priority
// class, topology spread. Without a serviceAccountName no token is mounted:
// the relay never talks to the API server; with one, the token is mounted,
// for workload identity.
func podSpec(relay *v1alpha1.OutboxRelay, container corev1.Container) corev1.PodSpec {
	spec := &relay.Spec.Relay
	container.ImagePullPolicy = spec.ImagePullPolicy
	container.Resources = *spec.Resources.DeepCopy()
	container.SecurityContext = containerSecurityContext()
	container.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	container.Env = withUserEnv(container.Env, spec.Env)
	container.VolumeMounts = append(container.VolumeMounts, deepCopyAll(spec.VolumeMounts)...)
	ps := corev1.PodSpec{
		Containers:                   []corev1.Container{container},
		AutomountServiceAccountToken: ptr.To(spec.ServiceAccountName != ""),
		ServiceAccountName:           spec.ServiceAccountName,
		PriorityClassName:            spec.PriorityClassName,
		EnableServiceLinks:           ptr.To(false),
		SecurityContext:              podSecurityContext(),
		ImagePullSecrets:             cloneSlice(spec.ImagePullSecrets),
		Tolerations:                  deepCopyAll(spec.Tolerations),
		TopologySpreadConstraints:    deepCopyAll(spec.TopologySpreadConstraints),
		Volumes:                      deepCopyAll(spec.Volumes),
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

// deepCopyAll deep-copies a slice of API structs; nil when empty.
func deepCopyAll[T any, P interface {
	*T
	DeepCopyInto(*T)
}](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	out := make([]T, len(s))
	for i := range s {
		P(&s[i]).DeepCopyInto(&out[i])
	}
	return out
}

// withUserEnv appends relay.env to the operator's variables; a user variable
// never replaces one of the operator's (admission refuses DATABASE_URL and
// REDIS_URL; this keeps the rule for whatever admission let through).
func withUserEnv(own, user []corev1.EnvVar) []corev1.EnvVar {
	out := own
	for i := range user {
		if !slices.ContainsFunc(own, func(e corev1.EnvVar) bool { return e.Name == user[i].Name }) {
			var e corev1.EnvVar
			user[i].DeepCopyInto(&e)
			out = append(out, e)
		}
	}
	return out
}

// podMeta is the metadata of a relay, cleanup or command pod: the labels
// and annotations of relay.podMetadata under the operator's own, which win.
func podMeta(relay *v1alpha1.OutboxRelay, labels, annotations map[string]string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Labels: map[string]string{}, Annotations: map[string]string{}}
	if pm := relay.Spec.Relay.PodMetadata; pm != nil {
		maps.Copy(m.Labels, pm.Labels)
		maps.Copy(m.Annotations, pm.Annotations)
	}
	maps.Copy(m.Labels, labels)
	maps.Copy(m.Annotations, annotations)
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	return m
}

// durationFlag formats a flag whose value is a Go duration.
func durationFlag(name string, d fmt.Stringer) string { return "--" + name + "=" + d.String() }
