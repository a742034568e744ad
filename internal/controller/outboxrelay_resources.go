package controller

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// relayResources are the child objects of an OutboxRelay as observed (from
// the cache) and then as written.
type relayResources struct {
	deployment *appsv1.Deployment
	cronJob    *batchv1.CronJob
}

// getResources reads the children from the cache; a missing child is nil.
func (r *OutboxRelayReconciler) getResources(ctx context.Context, relay *v1alpha1.OutboxRelay) (*relayResources, error) {
	dep, err := getOrNil(ctx, r.Client, types.NamespacedName{Namespace: relay.Namespace, Name: DeploymentName(relay)}, &appsv1.Deployment{})
	if err != nil {
		return nil, fmt.Errorf("getting Deployment: %w", err)
	}
	cj, err := getOrNil(ctx, r.Client, types.NamespacedName{Namespace: relay.Namespace, Name: CronJobName(relay)}, &batchv1.CronJob{})
	if err != nil {
		return nil, fmt.Errorf("getting CronJob: %w", err)
	}
	return &relayResources{deployment: dep, cronJob: cj}, nil
}

// getOrNil gets obj, or returns nil when it does not exist.
func getOrNil[T client.Object](ctx context.Context, c client.Reader, key types.NamespacedName, obj T) (T, error) {
	var zero T
	if err := c.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return zero, nil
		}
		return zero, err
	}
	return obj, nil
}
