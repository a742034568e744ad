package orders

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// samplesDir holds the manifests that run this application on a cluster.
const samplesDir = "../../config/samples"

// ourImage is the project's image, which runs as 65532 on a read-only root.
const ourImage = "ghcr.io/outbox-dev/outbox-operator:dev"

// sampleObjects parses every document of config/samples strictly into its
// typed object; unknown kinds fail, except the OutboxRelay, kept as a map.
func sampleObjects(t *testing.T) (pods map[string]corev1.PodTemplateSpec, secrets map[string]corev1.Secret, relays []map[string]any) {
	t.Helper()
	pods, secrets = map[string]corev1.PodTemplateSpec{}, map[string]corev1.Secret{}
	files, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	require.NoError(t, err)
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, doc := range strings.Split(string(raw), "\n---\n") {
			var meta struct{ Kind string }
			require.NoError(t, yaml.Unmarshal([]byte(doc), &meta), f)
			strict := func(obj any) { require.NoError(t, yaml.UnmarshalStrict([]byte(doc), obj), "%s: %s", f, meta.Kind) }
			switch meta.Kind {
			case "Secret":
				var s corev1.Secret
				strict(&s)
				secrets[s.Name] = s
			case "Service":
				strict(&corev1.Service{})
			case "Deployment":
				var d appsv1.Deployment
				strict(&d)
				require.Equal(t, d.Spec.Selector.MatchLabels, pickLabels(d.Spec.Template.Labels, d.Spec.Selector.MatchLabels), d.Name)
				pods["Deployment/"+d.Name] = d.Spec.Template
			case "StatefulSet":
				var s appsv1.StatefulSet
				strict(&s)
				pods["StatefulSet/"+s.Name] = s.Spec.Template
			case "Job":
				var j batchv1.Job
				strict(&j)
				pods["Job/"+j.Name] = j.Spec.Template
			case "OutboxRelay":
				var r map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(doc), &r))
				relays = append(relays, r)
			default:
				t.Fatalf("%s: unexpected kind %q", f, meta.Kind)
			}
		}
	}
	return pods, secrets, relays
}

func pickLabels(labels, keys map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keys {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

func TestSamplesKustomizationListsEveryManifest(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(samplesDir, "kustomization.yaml"))
	require.NoError(t, err)
	var k struct{ Resources []string }
	require.NoError(t, yaml.Unmarshal(raw, &k))
	files, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	require.NoError(t, err)
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	slices.Sort(k.Resources)
	require.Equal(t, want, k.Resources)
	require.Contains(t, k.Resources, "relay_v1alpha1_outboxrelay.yaml")
}

func TestSamplesRunEveryPieceUnderTheRestrictedProfile(t *testing.T) {
	t.Parallel()
	pods, _, _ := sampleObjects(t)
	require.ElementsMatch(t, []string{
		"StatefulSet/postgres", "Deployment/redis", "Job/orders-migrate", "Deployment/orders-api", "Deployment/worker",
	}, mapsKeys(pods))
	for name, p := range pods {
		sc := p.Spec.SecurityContext
		require.NotNil(t, sc, name)
		require.True(t, sc.RunAsNonRoot != nil && *sc.RunAsNonRoot, name)
		require.NotNil(t, sc.SeccompProfile, name)
		require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type, name)
		for _, c := range p.Spec.Containers {
			csc := c.SecurityContext
			require.NotNil(t, csc, name)
			require.False(t, csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation, name)
			require.Equal(t, []corev1.Capability{"ALL"}, csc.Capabilities.Drop, name)
			require.NotNil(t, c.Resources.Limits.Memory(), name)
			if c.Image == ourImage {
				require.EqualValues(t, 65532, *sc.RunAsUser, name)
				require.True(t, csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem, name)
				require.NotEmpty(t, c.Command, name)
			}
		}
	}
}

func TestSamplesPassConnectionStringsOnlyThroughSecrets(t *testing.T) {
	t.Parallel()
	pods, secrets, relays := sampleObjects(t)
	ref := func(where, name, key string) {
		s, ok := secrets[name]
		require.True(t, ok, "%s: Secret %s is not in the samples", where, name)
		_, ok = s.StringData[key]
		require.True(t, ok, "%s: Secret %s has no key %s", where, name, key)
	}
	for name, p := range pods {
		for _, c := range p.Spec.Containers {
			for _, arg := range append(slices.Clone(c.Command), c.Args...) {
				require.NotContains(t, arg, "://", "%s: a connection string in the command line", name)
			}
			for _, e := range c.Env {
				require.NotContains(t, e.Value, "password", "%s: %s", name, e.Name)
				require.NotContains(t, e.Value, "://", "%s: %s", name, e.Name)
				if e.Name == "DATABASE_URL" || e.Name == "REDIS_URL" {
					require.NotNil(t, e.ValueFrom, "%s: %s", name, e.Name)
					require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: %s", name, e.Name)
				}
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					ref(name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
	}
	require.Len(t, relays, 1)
	r := relays[0]
	require.Equal(t, "relay.outbox.dev/v1alpha1", r["apiVersion"])
	spec := r["spec"].(map[string]any)
	pg := spec["postgres"].(map[string]any)["dsnSecretRef"].(map[string]any)
	rd := spec["redis"].(map[string]any)["urlSecretRef"].(map[string]any)
	ref("OutboxRelay", pg["name"].(string), pg["key"].(string))
	ref("OutboxRelay", rd["name"].(string), rd["key"].(string))
	require.Equal(t, "jobs", spec["redis"].(map[string]any)["stream"], "the stream the worker reads")
	for _, s := range secrets {
		for k, v := range s.StringData {
			if strings.Contains(v, "password") || k == "password" {
				require.Contains(t, v, "demo-password-change-me", "%s/%s: demo values only, and obviously so", s.Name, k)
			}
		}
	}
}

func mapsKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
