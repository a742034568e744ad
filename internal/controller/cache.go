package controller

import (
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheOptions are the manager's cache settings the controller relies on:
// managedFields stripped from every cached object; Deployments and CronJobs
// cached only when labelled as managed by the operator (so the cache does
// not hold every Deployment of the cluster); the namespaces to watch (none:
// all). Secrets are never cached whole: the controller watches their
// metadata only, reduced to their identity and resourceVersion, and reads
// their data through the uncached API reader.
func CacheOptions(namespaces []string) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByOperator})
	secretMetadata := &metav1.PartialObjectMetadata{}
	secretMetadata.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}: {Label: managed},
			&batchv1.CronJob{}:   {Label: managed},
			secretMetadata:       {Transform: keepIdentityOnly},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// keepIdentityOnly reduces a cached object's metadata to what the Secret
// watch needs: namespace, name, UID and resourceVersion. Annotations go too:
// `kubectl apply` copies a whole Secret, data included, into
// kubectl.kubernetes.io/last-applied-configuration.
func keepIdentityOnly(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil {
		return in, nil
	}
	obj.SetManagedFields(nil)
	obj.SetAnnotations(nil)
	obj.SetLabels(nil)
	obj.SetOwnerReferences(nil)
	obj.SetFinalizers(nil)
	return in, nil
}

// ClientOptions make the manager's client read Secrets from the API server,
// never through a cache, even if some code asked the client for one.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}
