package controller

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// resolvedSecrets are the values an OutboxRelay's Secrets hold. They stay in
// memory: they are never logged, never written to an object, and reach the
// pods only through secretKeyRef.
type resolvedSecrets struct {
	dsn      string
	redisURL string
	// redisCA is the PEM CA of spec.redis.caSecretRef; nil when none.
	redisCA []byte
	// hash is a keyed hash of both references and values, for the pod
	// template's AnnotationSecretHash.
	hash string
}

// failure is a check that failed: the reason and message of a condition.
// Messages never hold a secret value.
type failure struct {
	reason  v1alpha1.Reason
	message string
}

// Error implements error, so a failure can be returned to the workqueue for
// a retry with backoff.
func (f *failure) Error() string { return string(f.reason) + ": " + f.message }

// secretField is one secret an OutboxRelay references.
type secretField struct {
	field string // the spec path, for messages
	ref   v1alpha1.SecretKeyReference
}

// resolveSecrets reads the DSN and the Redis URL from the OutboxRelay's own
// namespace. A missing Secret or key is a failure (a condition and a retry);
// an error of the API server is returned as an error.
func (r *OutboxRelayReconciler) resolveSecrets(ctx context.Context, relay *v1alpha1.OutboxRelay) (*resolvedSecrets, *failure, error) {
	fields := []secretField{
		{"spec.postgres.dsnSecretRef", relay.Spec.Postgres.DSNSecretRef},
		{"spec.redis.urlSecretRef", relay.Spec.Redis.URLSecretRef},
	}
	if ca := relay.Spec.Redis.CASecretRef; ca != nil {
		fields = append(fields, secretField{"spec.redis.caSecretRef", *ca})
	}
	names := make([]types.NamespacedName, len(fields))
	// keys are the keys read from each Secret: one named by two references
	// (the DSN and the Redis URL side by side) is read once.
	keys := map[string][]string{}
	for i, f := range fields {
		names[i] = types.NamespacedName{Namespace: relay.Namespace, Name: f.ref.Name}
		keys[f.ref.Name] = append(keys[f.ref.Name], f.ref.Key)
	}
	defer r.secretCache.use(client.ObjectKeyFromObject(relay), names...)

	values := make([]string, len(fields))
	for i, f := range fields {
		value, found, err := r.readSecretKey(ctx, names[i], f.ref.Key, keys[f.ref.Name])
		switch {
		case err != nil:
			return nil, nil, err
		case !found:
			return nil, &failure{v1alpha1.ReasonSecretNotFound, fmt.Sprintf(
				"Secret %q (%s) not found in namespace %q", f.ref.Name, f.field, relay.Namespace)}, nil
		case len(value) == 0:
			return nil, &failure{v1alpha1.ReasonSecretKeyMissing, fmt.Sprintf(
				"Secret %q (%s) has no key %q, or its value is empty", f.ref.Name, f.field, f.ref.Key)}, nil
		}
		values[i] = string(value)
	}

	res := &resolvedSecrets{dsn: values[0], redisURL: values[1]}
	if len(values) > 2 {
		res.redisCA = []byte(values[2])
	}
	// Checked without reading a file: a key that would read one is left to
	// the backlog check to report (DSNKeyNotAllowed), since the relays,
	// in the tenant's pods, may honour it.
	if !backlog.ValidDSN(res.dsn) {
		// The parse error is not quoted: it may hold parts of the DSN.
		return nil, &failure{v1alpha1.ReasonDSNInvalid, fmt.Sprintf(
			"the value of key %q of Secret %q (spec.postgres.dsnSecretRef) is not a PostgreSQL connection string "+
				"(a postgres:// URL, with '@' in the user and password percent-encoded as %%40, or key=value pairs)",
			relay.Spec.Postgres.DSNSecretRef.Key, relay.Spec.Postgres.DSNSecretRef.Name)}, nil
	}
	if !validRedisURL(res.redisURL) {
		return nil, &failure{v1alpha1.ReasonRedisURLInvalid, fmt.Sprintf(
			"the value of key %q of Secret %q (spec.redis.urlSecretRef) is not a Redis URL (%s)",
			relay.Spec.Redis.URLSecretRef.Key, relay.Spec.Redis.URLSecretRef.Name, strings.Join(redisconn.Schemes, ", "))}, nil
	}
	if f := checkRedisCA(relay, res); f != nil { // outboxrelay_redis.go
		return nil, f, nil
	}
	res.hash = secretHash(relay, fields, values)
	return res, nil, nil
}

// readSecretKey returns the value of one key of a Secret: from the
// secretCache when the metadata informer shows the resourceVersion it holds,
// else read from the API server (never through a cache of Secret data), when
// the values of keys (the keys the relay reads from that Secret, key among
// them) are cached too. found is false when the Secret does not exist.
func (r *OutboxRelayReconciler) readSecretKey(
	ctx context.Context, name types.NamespacedName, key string, keys []string,
) (value []byte, found bool, err error) {
	if r.MetadataReader != nil {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := r.MetadataReader.Get(ctx, name, meta); err == nil {
			if v, ok := r.secretCache.get(name, meta.ResourceVersion, key); ok {
				return v, true, nil
			}
		}
	}
	secret := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, name, secret); err != nil {
		if apierrors.IsNotFound(err) {
			r.secretCache.drop(name)
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("reading Secret %s: %w", name, err)
	}
	r.secretCache.put(name, secret.ResourceVersion, secret.Data, keys...)
	return secret.Data[key], true, nil
}

// validRedisURL reports whether s is a URL the relay's Redis client accepts.
func validRedisURL(s string) bool {
	return redisconn.Valid(s)
}

// secretHash is an HMAC-SHA256, keyed by the OutboxRelay's UID, of the
// references and the values: it changes when a value (or a reference)
// changes. The key makes equal Secrets hash differently in different relays,
// so no precomputed table applies; and the hash covers the whole DSN (host,
// user, database, password), never a password alone.
func secretHash(relay *v1alpha1.OutboxRelay, fields []secretField, values []string) string {
	mac := hmac.New(sha256.New, []byte(relay.UID))
	for i, f := range fields {
		_, _ = fmt.Fprintf(mac, "%q %q %q\n", f.ref.Name, f.ref.Key, values[i])
	}
	return hex.EncodeToString(mac.Sum(nil))[:32]
}
