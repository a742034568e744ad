package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// The Redis side of an OutboxRelay: the CA of spec.redis.caSecretRef in the
// relay pods, and the condition RedisDurable from the operator's own runs of
// the Redis checks of `relay doctor` (internal/backlog.CheckRedis).

// Where the CA of spec.redis.caSecretRef is mounted in the relay pods.
const (
	redisCAVolume    = "redis-ca"
	redisCAMountPath = "/etc/outbox-relay/redis-ca"
	redisCAFileName  = "ca.crt"
)

// redisCAArgs is --redis-ca-file when the OutboxRelay names a CA.
func redisCAArgs(relay *v1alpha1.OutboxRelay) []string {
	if relay.Spec.Redis.CASecretRef == nil {
		return nil
	}
	return []string{"--redis-ca-file=" + redisCAMountPath + "/" + redisCAFileName}
}

// withRedisCA adds the CA volume (the one key of the Secret, as ca.crt) to
// a relay pod spec and mounts it read-only into its container.
func withRedisCA(relay *v1alpha1.OutboxRelay, ps corev1.PodSpec) corev1.PodSpec {
	ref := relay.Spec.Redis.CASecretRef
	if ref == nil {
		return ps
	}
	for i := range ps.Containers {
		ps.Containers[i].VolumeMounts = append(ps.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: redisCAVolume, MountPath: redisCAMountPath, ReadOnly: true})
	}
	ps.Volumes = append(ps.Volumes, corev1.Volume{
		Name: redisCAVolume,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  ref.Name,
			Items:       []corev1.KeyToPath{{Key: ref.Key, Path: redisCAFileName}},
			DefaultMode: ptr.To[int32](0o444),
			Optional:    ptr.To(false),
		}},
	})
	return ps
}

// redisTarget is what the Prober's Redis checks look at for this relay.
func redisTarget(st *relayState) *backlog.RedisTarget {
	if st.secrets == nil {
		return nil
	}
	return &backlog.RedisTarget{
		URL:              st.secrets.redisURL,
		CA:               st.secrets.redisCA,
		Stream:           st.relay.Spec.Redis.GetStream(),
		DeadLetterStream: st.relay.Spec.Redis.DeadLetterStream,
	}
}

// redisDurableCondition folds the latest Redis checks into RedisDurable.
// Before the first run of this process, the condition in the status stands
// (a restart of the manager does not flap it).
func redisDurableCondition(st *relayState) condition {
	var res *backlog.RedisResult
	if st.backlog != nil && st.backlog.Last != nil {
		res = st.backlog.Last.Redis
	}
	if res == nil {
		if old := meta.FindStatusCondition(st.relay.Status.Conditions, string(v1alpha1.ConditionRedisDurable)); old != nil {
			return condition{old.Status, v1alpha1.Reason(old.Reason), old.Message}
		}
		return unknownCondition(v1alpha1.ReasonRedisCheckPending, "the Redis checks have not run yet")
	}
	s := doctor.Summarize(res.Checks)
	return condition{metav1.ConditionStatus(s.Status), v1alpha1.Reason(s.Reason), s.Message}
}

// setRedisDurable sets the RedisDurable condition in s.
func setRedisDurable(st *relayState, s *v1alpha1.OutboxRelayStatus) {
	c := redisDurableCondition(st)
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               string(v1alpha1.ConditionRedisDurable),
		Status:             c.status,
		Reason:             string(c.reason),
		Message:            c.message,
		ObservedGeneration: st.relay.Generation,
		LastTransitionTime: *metaTime(st.now),
	})
}

// redisDurableEvent says which Event, if any, a change of RedisDurable
// makes: one per new reason, Warning unless the new reason is RedisDurable;
// none while the checks are pending, and none for a first check that finds
// Redis durable.
func redisDurableEvent(old, now *metav1.Condition) (v1alpha1.Reason, bool) {
	if now == nil || now.Reason == string(v1alpha1.ReasonRedisCheckPending) {
		return "", false
	}
	if old != nil && old.Reason == now.Reason && old.Status == now.Status {
		return "", false
	}
	first := old == nil || old.Reason == string(v1alpha1.ReasonRedisCheckPending)
	if first && now.Reason == string(v1alpha1.ReasonRedisDurable) {
		return "", false
	}
	return v1alpha1.Reason(now.Reason), true
}

// recordRedisTransition logs and emits the Event of a RedisDurable change.
func (r *OutboxRelayReconciler) recordRedisTransition(
	ctx context.Context, relay *v1alpha1.OutboxRelay, old, now *v1alpha1.OutboxRelayStatus,
) {
	oldC := meta.FindStatusCondition(old.Conditions, string(v1alpha1.ConditionRedisDurable))
	nowC := meta.FindStatusCondition(now.Conditions, string(v1alpha1.ConditionRedisDurable))
	reason, ok := redisDurableEvent(oldC, nowC)
	if !ok {
		return
	}
	logf.FromContext(ctx).Info("Changed RedisDurable condition", "status", nowC.Status, "reason", nowC.Reason)
	eventType := corev1.EventTypeNormal
	if reason.IsFailure() {
		eventType = corev1.EventTypeWarning
	}
	r.event(relay, eventType, string(reason), "CheckRedis", nowC.Message)
}

// checkRedisCA refuses a CA with a URL that is not a TLS one: the relay
// would refuse to start.
func checkRedisCA(relay *v1alpha1.OutboxRelay, res *resolvedSecrets) *failure {
	ref := relay.Spec.Redis.CASecretRef
	if ref == nil {
		return nil
	}
	if t, err := redisconn.Parse(res.redisURL); err == nil && !t.TLS {
		return &failure{v1alpha1.ReasonRedisURLInvalid, fmt.Sprintf(
			"spec.redis.caSecretRef names a CA (Secret %q), but the URL under spec.redis.urlSecretRef is not a TLS one "+
				"(rediss://, rediss-sentinel:// or rediss-cluster://)", ref.Name)}
	}
	return nil
}
