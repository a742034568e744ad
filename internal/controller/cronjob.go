package controller

import (
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// cleanupContainerName is the name of the cleanup container.
const cleanupContainerName = "cleanup"

// CleanupCronJob builds the CronJob <name>-cleanup that runs `relay cleanup`
// for an OutboxRelay: batched deletes of dispatched rows older than the
// retention (source LogicalReplication: of streamed rows by created_at,
// behind the slot's progress), never two at a time. It needs only the DSN. It makes no client
// call; the owner reference is set by the caller.
func CleanupCronJob(relay *v1alpha1.OutboxRelay, image string) *batchv1.CronJob {
	spec := &relay.Spec
	labels := objectLabels(relay, ComponentCleanup)
	args := append(layoutArgs(relay),
		durationFlag("retention", spec.Cleanup.GetRetention()),
		"--batch-size="+strconv.Itoa(int(spec.Cleanup.GetBatchSize())),
	)
	if spec.ReadsLogicalReplication() {
		// Rows are never marked dispatched: delete them by age, behind the
		// slot's progress (relay cleanup --slot).
		args = append(args, "--slot="+ReplicationSlotName(relay))
	}
	container := corev1.Container{
		Name:    cleanupContainerName,
		Image:   relayImage(relay, image),
		Command: []string{relayBinary, "cleanup"},
		Args:    args,
		Env:     []corev1.EnvVar{secretEnv(envDatabaseURL, spec.Postgres.DSNSecretRef)},
	}
	pod := podSpec(relay, container)
	pod.RestartPolicy = corev1.RestartPolicyNever
	return &batchv1.CronJob{
		TypeMeta: metav1.TypeMeta{APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "CronJob"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      CronJobName(relay),
			Namespace: relay.Namespace,
			Labels:    labels,
		},
		Spec: batchv1.CronJobSpec{
			Schedule:                   spec.Cleanup.GetSchedule(),
			Suspend:                    ptr.To(spec.Cleanup.Suspend),
			ConcurrencyPolicy:          batchv1.ForbidConcurrent,
			StartingDeadlineSeconds:    ptr.To[int64](300),
			SuccessfulJobsHistoryLimit: ptr.To[int32](1),
			FailedJobsHistoryLimit:     ptr.To[int32](3),
			JobTemplate: batchv1.JobTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: objectLabels(relay, ComponentCleanup)},
				Spec: batchv1.JobSpec{
					BackoffLimit: ptr.To[int32](2),
					Template: corev1.PodTemplateSpec{
						ObjectMeta: podMeta(relay, objectLabels(relay, ComponentCleanup),
							map[string]string{annotationDefaultContainer: cleanupContainerName}),
						Spec: pod,
					},
				},
			},
		},
	}
}
