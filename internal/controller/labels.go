package controller

import (
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
