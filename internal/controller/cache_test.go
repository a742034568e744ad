package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestKeepIdentityOnly(t *testing.T) {
	t.Parallel()
	in := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "db", UID: "u", ResourceVersion: "7",
		Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"dsn":"c2VjcmV0"}}`},
		Labels:        map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}}
	out, err := keepIdentityOnly(in)
	require.NoError(t, err)
	require.Equal(t, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "db", UID: "u", ResourceVersion: "7",
	}}, out)
}

func TestCacheOptions(t *testing.T) {
	t.Parallel()
	opts := CacheOptions([]string{"shop", "billing"})
	require.Len(t, opts.DefaultNamespaces, 2)
	require.Len(t, opts.ByObject, 3, "Deployments, CronJobs and Secret metadata have their own settings")
	require.Empty(t, CacheOptions(nil).DefaultNamespaces, "no namespaces: all")
}
