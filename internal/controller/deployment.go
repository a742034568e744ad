package controller

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// relayContainerName is the name of the relay container.
const relayContainerName = "relay"

// RelayDeployment builds the Deployment <name>-relay that runs `relay run`
// for an OutboxRelay, with replicas relays. image is the default image (the
// OutboxRelay's relay.image wins); secretHash goes into the pod template so
// that a change of the referenced Secrets rolls the pods. It makes no client
// call; the owner reference is set by the caller.
func RelayDeployment(relay *v1alpha1.OutboxRelay, image, secretHash string, replicas int32) *appsv1.Deployment {
	labels := objectLabels(relay, ComponentRelay)
	container := corev1.Container{
		Name:    relayContainerName,
		Image:   relayImage(relay, image),
		Command: []string{relayBinary, "run"},
		Args:    relayArgs(relay),
		Env: []corev1.EnvVar{
			secretEnv(envDatabaseURL, relay.Spec.Postgres.DSNSecretRef),
			secretEnv(envRedisURL, relay.Spec.Redis.URLSecretRef),
		},
		Ports: []corev1.ContainerPort{
			{Name: metricsPortName, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
			{Name: healthPortName, ContainerPort: healthPort, Protocol: corev1.ProtocolTCP},
		},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:     httpGet("/healthz"),
			PeriodSeconds:    10,
			TimeoutSeconds:   2,
			FailureThreshold: 3,
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:     httpGet("/readyz"),
			PeriodSeconds:    5,
			TimeoutSeconds:   2,
			FailureThreshold: 2,
		},
	}
	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      DeploymentName(relay),
			Namespace: relay.Namespace,
			Labels:    labels,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas:             ptr.To(replicas),
			Selector:             &metav1.LabelSelector{MatchLabels: selectorLabels(relay, ComponentRelay)},
			RevisionHistoryLimit: ptr.To[int32](3),
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: podMeta(relay, objectLabels(relay, ComponentRelay), map[string]string{
					AnnotationSecretHash:       secretHash,
					annotationDefaultContainer: relayContainerName,
				}),
				Spec: withRedisCA(relay, podSpec(relay, container)),
			},
		},
	}
}

// relayArgs are the flags of `relay run`, everything but the secrets.
func relayArgs(relay *v1alpha1.OutboxRelay) []string {
	spec := &relay.Spec
	args := layoutArgs(relay)
	args = append(args, "--stream="+spec.Redis.GetStream())
	args = append(args, redisCAArgs(relay)...) // outboxrelay_redis.go
	if spec.Redis.DeadLetterStream != "" {
		args = append(args, "--dead-letter-stream="+spec.Redis.DeadLetterStream)
	}
	if spec.Ordering != "" && spec.Ordering != v1alpha1.OrderingNone {
		// Only when set: the default adds no flag, so existing relays do
		// not roll when the operator is upgraded.
		args = append(args, "--ordering="+string(spec.Ordering))
	}
	if spec.Cleanup.DeletesOnDispatch() { // only when set, like --ordering
		args = append(args, "--cleanup-mode="+string(v1alpha1.CleanupOnDispatch))
	}
	if b := spec.Relay.BatchBytes; b != nil { // only when set, like --ordering
		args = append(args, "--batch-bytes="+strconv.FormatInt(b.Value(), 10))
	}
	args = append(args, streamArgs(relay)...) // outboxrelay_stream.go
	args = append(args, sourceArgs(relay)...) // outboxrelay_replication.go
	return append(args,
		"--batch-size="+strconv.Itoa(int(spec.Relay.GetBatchSize())),
		durationFlag("poll-interval", spec.Relay.GetPollInterval()),
		"--metrics-bind-address=:"+strconv.Itoa(int(metricsPort)),
		"--health-probe-bind-address=:"+strconv.Itoa(int(healthPort)),
	)
}

func httpGet(path string) corev1.ProbeHandler {
	return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path:   path,
		Port:   intstr.FromString(healthPortName),
		Scheme: corev1.URISchemeHTTP,
	}}
}
