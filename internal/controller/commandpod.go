package controller

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// ComponentCommand labels the short-lived pods that run one relay subcommand
// for a person (kubectl outbox). It differs from ComponentRelay so that the
// relay Deployment's selector never adopts them.
const ComponentCommand = "command"

// commandContainerName is the name of the container of a command pod.
const commandContainerName = "relay"

// RelayCommandPod builds a Pod that runs `relay <command...> <flags...>` once
// for an OutboxRelay, the way the operator runs its relay pods: image
// (relay.image wins over image), the DSN Secret as DATABASE_URL through a
// secretKeyRef, the Redis URL Secret as REDIS_URL (and the Redis CA volume
// and flag) only when withRedis, the restricted security context, the
// scheduling, service account and extras of spec.relay, and the layout flags
// of the table. The pod never restarts, and its name is generated from
// <name>-<command[0]>-. It makes no client call.
func RelayCommandPod(relay *v1alpha1.OutboxRelay, image string, command, flags []string, withRedis bool) *corev1.Pod {
	args := layoutArgs(relay)
	env := []corev1.EnvVar{secretEnv(envDatabaseURL, relay.Spec.Postgres.DSNSecretRef)}
	if withRedis {
		args = append(args, redisCAArgs(relay)...)
		env = append(env, secretEnv(envRedisURL, relay.Spec.Redis.URLSecretRef))
	}
	container := corev1.Container{
		Name:    commandContainerName,
		Image:   relayImage(relay, image),
		Command: append([]string{relayBinary}, command...),
		Args:    append(args, flags...),
		Env:     env,
	}
	ps := podSpec(relay, container)
	ps.RestartPolicy = corev1.RestartPolicyNever
	ps.TerminationGracePeriodSeconds = ptr.To[int64](10)
	if withRedis {
		ps = withRedisCA(relay, ps)
	}
	labels := selectorLabels(relay, ComponentCommand)
	labels[LabelManagedBy] = "kubectl-outbox"
	prefix := relay.Name + "-"
	if len(command) > 0 {
		prefix += command[0] + "-"
	}
	meta := podMeta(relay, labels, map[string]string{annotationDefaultContainer: commandContainerName})
	meta.GenerateName, meta.Namespace = prefix, relay.Namespace
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: corev1.SchemeGroupVersion.String(), Kind: "Pod"},
		ObjectMeta: meta,
		Spec:       ps,
	}
}
