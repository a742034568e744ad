package controller

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// relayOption changes a fixture OutboxRelay.
type relayOption func(*v1alpha1.OutboxRelay)

// newRelay is a fixture OutboxRelay as the API server stores it after
// defaulting (the markers' defaults spelled out), changed by opts.
func newRelay(namespace, name string, opts ...relayOption) *v1alpha1.OutboxRelay {
	r := &v1alpha1.OutboxRelay{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "OutboxRelay"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.OutboxRelaySpec{
			Postgres: v1alpha1.PostgresSpec{
				DSNSecretRef: v1alpha1.SecretKeyReference{Name: name + "-db", Key: "dsn"},
			},
			Redis: v1alpha1.RedisSpec{
				URLSecretRef: v1alpha1.SecretKeyReference{Name: name + "-redis", Key: "url"},
			},
		},
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

func withTable(table string) relayOption {
	return func(r *v1alpha1.OutboxRelay) { r.Spec.Postgres.Table = table }
}

func withStream(stream string) relayOption {
	return func(r *v1alpha1.OutboxRelay) { r.Spec.Redis.Stream = stream }
}

func withReplicas(minimum, maximum int32, target int64, window string) relayOption {
	return func(r *v1alpha1.OutboxRelay) {
		r.Spec.Replicas = v1alpha1.ReplicasSpec{Min: ptr.To(minimum), Max: maximum, TargetBacklogPerReplica: target}
		if window != "" {
			r.Spec.Replicas.ScaleDownStabilizationWindow = duration(window)
		}
	}
}

// withFastChecks measures the backlog every second.
func withFastChecks() relayOption {
	return func(r *v1alpha1.OutboxRelay) { r.Spec.Backlog.CheckInterval = duration("1s") }
}

func withSuspend() relayOption {
	return func(r *v1alpha1.OutboxRelay) { r.Spec.Suspend = true }
}

// duration parses a Go duration for a fixture; it panics on a typo.
func duration(s string) *metav1.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return &metav1.Duration{Duration: d}
}
