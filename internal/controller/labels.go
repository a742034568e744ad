package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// Label keys and values set on every child object and on its pods.
const (
	// LabelName is the application's name, always NameOutboxRelay.
	LabelName = "app.kubernetes.io/name"
	// LabelInstance is the name of the OutboxRelay.
	LabelInstance = "app.kubernetes.io/instance"
	// LabelComponent is ComponentRelay or ComponentCleanup.
	LabelComponent = "app.kubernetes.io/component"
	// LabelManagedBy is always ManagedByOperator; the manager's cache only
	// holds Deployments and CronJobs with this label.
	LabelManagedBy = "app.kubernetes.io/managed-by"

	// NameOutboxRelay is the value of LabelName.
	NameOutboxRelay = "outbox-relay"
	// ManagedByOperator is the value of LabelManagedBy.
	ManagedByOperator = "outbox-operator"
	// ComponentRelay labels the relay Deployment and its pods.
	ComponentRelay = "relay"
	// ComponentCleanup labels the cleanup CronJob, its Jobs and their pods.
	ComponentCleanup = "cleanup"
)

// Annotation keys the operator sets.
const (
	// AnnotationSecretHash, on a pod template, is a keyed hash of the
	// referenced Secret data: when a Secret changes, the hash changes and the
	// pods roll. It is an HMAC keyed by the OutboxRelay's UID over the whole
	// values (see secretHash), never a bare digest of a password.
	AnnotationSecretHash = "relay.outbox.dev/secret-hash"
	// AnnotationSpecHash, on a child object, is a hash of what the operator
	// last wrote; a different hash means the object must be written again.
	AnnotationSpecHash = "relay.outbox.dev/spec-hash"
	// annotationDefaultContainer makes kubectl logs and exec pick the relay.
	annotationDefaultContainer = "kubectl.kubernetes.io/default-container"
)

// Names of the child objects.
const (
	deploymentSuffix = "-relay"
	cronJobSuffix    = "-cleanup"
)

// DeploymentName is the name of the relay Deployment of an OutboxRelay.
func DeploymentName(relay *v1alpha1.OutboxRelay) string { return relay.Name + deploymentSuffix }

// CronJobName is the name of the cleanup CronJob of an OutboxRelay.
func CronJobName(relay *v1alpha1.OutboxRelay) string { return relay.Name + cronJobSuffix }

// selectorLabels select the pods of one component of one OutboxRelay; they
// are a Deployment's immutable selector, so they never change.
func selectorLabels(relay *v1alpha1.OutboxRelay, component string) map[string]string {
	return map[string]string{
		LabelName:      NameOutboxRelay,
		LabelInstance:  relay.Name,
		LabelComponent: component,
	}
}

// objectLabels are set on a child object and its pod template.
func objectLabels(relay *v1alpha1.OutboxRelay, component string) map[string]string {
	l := selectorLabels(relay, component)
	l[LabelManagedBy] = ManagedByOperator
	return l
}

// slotPrefix starts the name of every replication slot the operator names.
const slotPrefix = "outbox_"

// maxSlotName is PostgreSQL's limit on a slot's name (NAMEDATALEN-1 bytes).
const maxSlotName = 63

// slotHashLength is the number of hex digits of the hash ending a slot name
// (40 bits).
const slotHashLength = 10

// ReplicationSlotName is the logical replication slot of an OutboxRelay of
// source LogicalReplication: outbox_<namespace>_<name>, lower-cased, every
// character other than a-z, 0-9 and _ turned into _, cut to fit 63 bytes,
// then _ and a hash of the namespace and name. Slot names are per
// PostgreSQL server, so the namespace is part of it; the readable part alone
// could be shared ("a-b"/"c" and "a"/"b-c" both read outbox_a_b_c, and a cut
// drops the end), so the hash always follows and tells every pair of
// namespace and name apart. It is deterministic: the same OutboxRelay
// created again finds its slot.
func ReplicationSlotName(relay *v1alpha1.OutboxRelay) string {
	return replicationSlotName(relay.Namespace, relay.Name)
}

func replicationSlotName(namespace, name string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name)) // "/" is in neither
	suffix := "_" + hex.EncodeToString(sum[:])[:slotHashLength]
	readable := []byte(strings.ToLower(slotPrefix + namespace + "_" + name))
	for i, c := range readable {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			readable[i] = '_'
		}
	}
	if n := maxSlotName - len(suffix); len(readable) > n {
		readable = readable[:n]
	}
	return string(readable) + suffix
}
