/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretKeyReference names one key of a Secret in the OutboxRelay's own
// namespace. Secrets of other namespaces are never read.
type SecretKeyReference struct {
	// name of the Secret, in the namespace of the OutboxRelay.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be the name of a Secret: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	Name string `json:"name"`

	// key of the Secret's data that holds the value.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$')",message="must be a Secret key: letters, digits, '-', '_' and '.'"
	Key string `json:"key"`
}

// PostgresSpec says where the outbox table is and how it is laid out.
type PostgresSpec struct {
	// dsnSecretRef names the Secret key that holds the PostgreSQL connection
	// string (a postgres:// URL or a key=value DSN). The DSN reaches the relay
	// pods only as the environment variable DATABASE_URL, through a
	// secretKeyRef; the operator reads it to measure the backlog.
	// +required
	DSNSecretRef SecretKeyReference `json:"dsnSecretRef"`

	// table is the outbox table, optionally schema-qualified (schema.table).
	// Names are used exactly as written (quoted), so they are case-sensitive.
	// It cannot change on a live relay: the rows still pending in the old
	// table would be left without a relay; create a new OutboxRelay instead.
	// +optional
	// +kubebuilder:default="outbox_events"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="postgres.table cannot change on a live relay (its pending rows would be left without a relay): create a new OutboxRelay"
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z_][A-Za-z0-9_]{0,62}[.])?[A-Za-z_][A-Za-z0-9_]{0,62}$')",message="must be table or schema.table, each name at most 63 characters of letters, digits and underscores, not starting with a digit"
	Table string `json:"table,omitempty"`

	// columns overrides the names of the outbox table's columns; each one
	// left out keeps its default name.
	// +optional
	// +kubebuilder:default={}
	Columns OutboxColumns `json:"columns,omitempty"`
}

// OutboxColumns names the columns of the outbox table.
//
// +kubebuilder:validation:XValidation:rule="[has(self.id) ? self.id : 'id', has(self.eventType) ? self.eventType : 'event_type', has(self.payload) ? self.payload : 'payload', has(self.createdAt) ? self.createdAt : 'created_at', has(self.dispatchedAt) ? self.dispatchedAt : 'dispatched_at'].all(c, [has(self.id) ? self.id : 'id', has(self.eventType) ? self.eventType : 'event_type', has(self.payload) ? self.payload : 'payload', has(self.createdAt) ? self.createdAt : 'created_at', has(self.dispatchedAt) ? self.dispatchedAt : 'dispatched_at'].filter(d, d == c).size() == 1)",message="columns must name five different columns"
// +kubebuilder:validation:XValidation:rule="!has(self.key) || ![has(self.id) ? self.id : 'id', has(self.eventType) ? self.eventType : 'event_type', has(self.payload) ? self.payload : 'payload', has(self.createdAt) ? self.createdAt : 'created_at', has(self.dispatchedAt) ? self.dispatchedAt : 'dispatched_at'].exists(c, c == self.key)",message="columns.key must name a column other than the five others"
type OutboxColumns struct {
	// id is the event's identity; any type that casts to text.
	// +optional
	// +kubebuilder:default="id"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	ID string `json:"id,omitempty"`

	// eventType is a text or varchar column with the event's type.
	// +optional
	// +kubebuilder:default="event_type"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	EventType string `json:"eventType,omitempty"`

	// payload is a text or jsonb column, published verbatim.
	// +optional
	// +kubebuilder:default="payload"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	Payload string `json:"payload,omitempty"`

	// createdAt is a timestamp or timestamptz column that orders the outbox.
	// +optional
	// +kubebuilder:default="created_at"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	CreatedAt string `json:"createdAt,omitempty"`

	// dispatchedAt is a nullable timestamp or timestamptz column: NULL while
	// the event waits to be published.
	// +optional
	// +kubebuilder:default="dispatched_at"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	DispatchedAt string `json:"dispatchedAt,omitempty"`

	// key is the column whose value orders events per key with ordering
	// PerKey (the aggregate id: an order, an account); any type that casts
	// to text. It is hashed into the key partitions the relays own, and each
	// stream entry then carries it as a field "key". No default: required
	// by, and only used with, ordering PerKey.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="must be a column name: letters, digits and underscores, not starting with a digit"
	Key string `json:"key,omitempty"`
}

// RedisSpec says where the events go.
// +kubebuilder:validation:XValidation:rule="!has(self.deadLetterStream) || self.deadLetterStream != (has(self.stream) ? self.stream : 'jobs')",message="redis.deadLetterStream must differ from redis.stream"
type RedisSpec struct {
	// urlSecretRef names the Secret key that holds the Redis URL: redis://
	// or rediss:// (one server), redis-sentinel:// or rediss-sentinel://
	// (?master_name=..., more sentinels as &addr=host:port), redis-cluster://
	// or rediss-cluster:// (more seed nodes as ?addr=host:port); user and
	// password in the URL (an ACL user). It reaches the relay pods only as
	// the environment variable REDIS_URL, through a secretKeyRef.
	// +required
	URLSecretRef SecretKeyReference `json:"urlSecretRef"`

	// caSecretRef names the Secret key that holds the PEM certificate(s) of
	// the CA that signed the Redis servers' certificates, for a TLS URL
	// (rediss://, rediss-sentinel://, rediss-cluster://) whose servers a
	// private CA signed. It is mounted read-only into the relay pods and
	// passed as --redis-ca-file; the operator's own Redis checks use it too.
	// Empty: the system's roots.
	// +optional
	CASecretRef *SecretKeyReference `json:"caSecretRef,omitempty"`

	// stream is the Redis stream the relays add the events to. It cannot
	// change on a live relay: consumers of the old stream would miss what
	// follows while the relays switch; create a new OutboxRelay instead.
	// +optional
	// +kubebuilder:default="jobs"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="redis.stream cannot change on a live relay (consumers of the old stream would silently miss events): create a new OutboxRelay"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_.:{}/-]+$')",message="must be a stream name of letters, digits and _ . : { } / -"
	Stream string `json:"stream,omitempty"`

	// deadLetterStream is where the relays put the rows Redis rejects. Empty
	// means <stream>.dead.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_.:{}/-]+$')",message="must be a stream name of letters, digits and _ . : { } / -"
	DeadLetterStream string `json:"deadLetterStream,omitempty"`

	// waitReplicas, when set, makes every batch wait (Redis WAIT) for this
	// many replicas to acknowledge its entries before the batch commits;
	// fewer within waitTimeout roll the batch back to be retried, so a
	// failover to one of them cannot lose a committed batch. It costs a
	// replication round trip per batch (docs/benchmarks.md). 0: no wait.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	WaitReplicas int32 `json:"waitReplicas,omitempty"`

	// waitTimeout bounds that wait. Empty means 1s; it must stay below the
	// relay's publish timeout (5s).
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) < duration('5s')",message="must be between 0s and 5s, exclusive"
	WaitTimeout *metav1.Duration `json:"waitTimeout,omitempty"`

	// trim bounds the stream's length or age. The relays trim it in the
	// background (XTRIM MINID), never removing an entry that a consumer
	// group of the stream has not yet been delivered and acknowledged; a
	// stream without groups (none created yet, or gone with a stream reset)
	// is not trimmed. Empty: the stream is never trimmed.
	// +optional
	Trim *TrimSpec `json:"trim,omitempty"`

	// autoReplay makes the relays republish, by themselves, the rows
	// dispatched in the window of a stream reset they detect (the stream
	// lost entries), at most cleanup.retention back; with source
	// LogicalReplication, which marks no row, every row created in the
	// cleanup.retention before the reset's detection. Off: the reset is
	// shown in the StreamIntact condition for a person to replay.
	// +optional
	AutoReplay bool `json:"autoReplay,omitempty"`
}

// TrimSpec is the stream's trimming policy: an entry is removed when it is
// beyond maxLen or older than maxAge (whichever removes more), and only once
// every consumer group is done with it.
// +kubebuilder:validation:XValidation:rule="has(self.maxLen) || has(self.maxAge)",message="set maxLen, maxAge or both"
type TrimSpec struct {
	// maxLen keeps at most about this many entries.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxLen *int64 `json:"maxLen,omitempty"`

	// maxAge removes entries older than this.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="must be at least 1s"
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// interval is the time between two trims. Empty means 1m.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="must be at least 1s"
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// RelaySpec shapes the relay pods.
type RelaySpec struct {
	// image of the relay container. Empty means the operator's own image (or
	// its --relay-image flag); the image must hold the relay at /relay.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// imagePullPolicy of the relay and cleanup containers. Empty means the
	// Kubernetes default (Always for :latest, else IfNotPresent).
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// imagePullSecrets are Secrets in the OutboxRelay's namespace used to pull
	// the image.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// batchSize is the number of rows a relay claims per transaction.
	// +optional
	// +kubebuilder:default=500
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	BatchSize int32 `json:"batchSize,omitempty"`

	// batchBytes bounds the ids, types and payloads of one batch in a
	// relay's memory: a claim that reads more is made again with the rows
	// that fit, so rows of large payloads are claimed a few at a time rather
	// than batchSize at once. A relay holds up to two batches (in flight)
	// and one row more; a single row larger than this is still claimed,
	// alone. Between 64Ki and 1Gi. Empty means the relay's default, 16Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('64Ki')) >= 0 && quantity(string(self)).compareTo(quantity('1Gi')) <= 0",message="relay.batchBytes must be between 64Ki and 1Gi"
	BatchBytes *resource.Quantity `json:"batchBytes,omitempty"`

	// pollInterval is how long a relay sleeps after an empty or partial batch,
	// between 10ms and 1m.
	// +optional
	// +kubebuilder:default="500ms"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10ms') && duration(self) <= duration('1m')",message="relay.pollInterval must be between 10ms and 1m"
	PollInterval *metav1.Duration `json:"pollInterval,omitempty"`

	// logLevel of the relay and cleanup programs.
	// +optional
	// +kubebuilder:default="info"
	// +kubebuilder:validation:Enum=debug;info;warn;error
	LogLevel string `json:"logLevel,omitempty"`

	// resources of the relay and cleanup containers.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// nodeSelector of the relay and cleanup pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations of the relay and cleanup pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// affinity of the relay and cleanup pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// podMetadata adds labels and annotations to the relay and cleanup pods
	// (cost allocation, service-mesh injection). The labels and annotations
	// the operator sets itself win.
	// +optional
	PodMetadata *PodMetadata `json:"podMetadata,omitempty"`

	// serviceAccountName runs the relay and cleanup pods (and the pods of
	// kubectl outbox) as this ServiceAccount of the OutboxRelay's namespace,
	// with its token mounted (workload identity for a cloud database). Empty
	// means the namespace's default ServiceAccount with no token mounted: the
	// relay never talks to the API server.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// priorityClassName of the relay and cleanup pods.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// topologySpreadConstraints of the relay pods (and the cleanup pods),
	// for example to spread the relays over zones.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// env adds environment variables to the relay and cleanup containers:
	// RELAY_<FLAG> sets a flag of the relay that the operator does not set
	// (docs/relay-cli.md), PGSSLROOTCERT and the like configure libpq.
	// DATABASE_URL and REDIS_URL are the operator's and are refused, as are
	// RELAY_SOURCE, RELAY_SLOT and RELAY_CLEANUP_MODE: the operator passes
	// those flags only when they differ from the defaults, so a variable
	// would set them behind spec.source and spec.cleanup.mode (RELAY_SLOT on
	// a Polling relay turns its cleanup into cleanup --slot, which deletes
	// rows by age, dispatched or not).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, e.name != 'DATABASE_URL' && e.name != 'REDIS_URL')",message="relay.env must not set DATABASE_URL or REDIS_URL: the operator sets them from postgres.dsnSecretRef and redis.urlSecretRef"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['RELAY_SOURCE', 'RELAY_SLOT', 'RELAY_CLEANUP_MODE']))",message="relay.env must not set RELAY_SOURCE, RELAY_SLOT or RELAY_CLEANUP_MODE: use spec.source and spec.cleanup.mode (the operator names the slot); as variables they reach the cleanup container too, and RELAY_SLOT makes a Polling relay's cleanup delete rows by age, dispatched or not"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// volumes adds volumes to the relay and cleanup pods, for example a
	// Secret or ConfigMap with a CA for sslrootcert. The kinds of volume the
	// restricted Pod Security Standard allows, and no name the operator uses
	// (redis-ca).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(v, v.name != 'redis-ca')",message="relay.volumes must not be named redis-ca: the operator mounts redis.caSecretRef under that name"
	// +kubebuilder:validation:XValidation:rule="self.all(v, has(v.configMap) || has(v.secret) || has(v.emptyDir) || has(v.projected) || has(v.downwardAPI) || has(v.csi) || has(v.persistentVolumeClaim) || has(v.ephemeral))",message="relay.volumes may only be configMap, secret, emptyDir, projected, downwardAPI, csi, persistentVolumeClaim or ephemeral: the kinds the restricted Pod Security Standard admits"
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// volumeMounts adds mounts of volumes to the relay and cleanup
	// containers.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
}

// PodMetadata are labels and annotations for pods.
type PodMetadata struct {
	// labels to add to the pods.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('app.kubernetes.io/'))",message="relay.podMetadata.labels must not set app.kubernetes.io/ labels: the operator selects its pods by them"
	Labels map[string]string `json:"labels,omitempty"`

	// annotations to add to the pods.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('relay.outbox.dev/'))",message="relay.podMetadata.annotations must not set relay.outbox.dev/ annotations: they are the operator's"
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ReplicasSpec sets how many relays run: the backlog divided by
// targetBacklogPerReplica, rounded up, between min and max.
//
// +kubebuilder:validation:XValidation:rule="!has(self.min) || !has(self.max) || self.min <= self.max",message="replicas.min must not be greater than replicas.max",fieldPath=".min"
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'External' || has(self.count)",message="replicas.count is required when replicas.mode is External: the autoscaler scales from it (start with 1)",fieldPath=".count"
// +kubebuilder:validation:XValidation:rule="!has(self.count) || (has(self.mode) && self.mode == 'External')",message="replicas.count is only used when replicas.mode is External (kubectl scale and autoscalers need it); in Operator mode the backlog sets the relays between min and max",fieldPath=".count"
type ReplicasSpec struct {
	// mode says who sets the number of relays. Operator (the default): the
	// operator, from the backlog, between min and max. External: an
	// autoscaler (KEDA, an HPA) through the OutboxRelay's scale subresource,
	// which writes count; the operator copies count to the Deployment and
	// ignores min, max, targetBacklogPerReplica and the window. suspend
	// still scales to 0 in both modes.
	// +optional
	// +kubebuilder:default=Operator
	// +kubebuilder:validation:Enum=Operator;External
	Mode ReplicasMode `json:"mode,omitempty"`

	// count is the number of relays in External mode: the scale
	// subresource's replicas (kubectl scale outboxrelay NAME --replicas N
	// writes it, as KEDA and an HPA do). Required in External mode (start
	// with 1: an HPA does not scale a target at 0), refused in Operator mode.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Count *int32 `json:"count,omitempty"`

	// min is the fewest relays that run (0 lets an empty outbox scale the
	// relays to zero until the next backlog check finds rows).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Min *int32 `json:"min,omitempty"`

	// max is the most relays that run.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Max int32 `json:"max,omitempty"`

	// targetBacklogPerReplica is the backlog one relay is expected to keep up
	// with.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	TargetBacklogPerReplica int64 `json:"targetBacklogPerReplica,omitempty"`

	// scaleDownStabilizationWindow is how long the backlog must keep asking
	// for fewer relays before they are scaled down (scaling up is immediate),
	// between 0s and 1h.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="replicas.scaleDownStabilizationWindow must be between 0s and 1h"
	ScaleDownStabilizationWindow *metav1.Duration `json:"scaleDownStabilizationWindow,omitempty"`
}

// ReplicasMode says who sets the number of relays.
type ReplicasMode string

// The replica modes.
const (
	// ReplicasModeOperator: the operator scales the relays by the backlog.
	ReplicasModeOperator ReplicasMode = "Operator"
	// ReplicasModeExternal: an autoscaler writes replicas.count through the
	// scale subresource; the operator copies it to the Deployment.
	ReplicasModeExternal ReplicasMode = "External"
)

// CleanupSpec says when dispatched rows are deleted, and shapes the CronJob
// that deletes them after the retention.
type CleanupSpec struct {
	// mode says when a dispatched row is deleted. AfterRetention (the
	// default): the relay marks it dispatched (dispatched_at) and the
	// cleanup CronJob deletes it once it is older than retention, so a
	// replay can republish it in the meantime (after a stream lost entries).
	// OnDispatch: the relay's claim deletes the rows it publishes, in the
	// transaction it commits after Redis acknowledged them, so there is no
	// dispatched_at to write, no CronJob and no rows to clean, and a claim
	// is cheaper (docs/benchmarks.md); nothing is left to replay from, so it
	// excludes redis.autoReplay. Rows marked before a switch to OnDispatch
	// are left alone: run relay cleanup once (docs/relay.md, "Cleanup modes").
	// +optional
	// +kubebuilder:default=AfterRetention
	Mode CleanupMode `json:"mode,omitempty"`

	// schedule of the cleanup, a cron expression of five fields (minute hour
	// day-of-month month day-of-week) in the controller manager's time zone.
	// +optional
	// +kubebuilder:default="17 * * * *"
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9A-Za-z*?/,-]+( +[0-9A-Za-z*?/,-]+){4}$')",message="cleanup.schedule must be a cron expression of five fields (minute hour day-of-month month day-of-week), e.g. \"17 * * * *\""
	// +kubebuilder:validation:XValidation:rule="self.matches('^([*]|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[0-9]+)?(,([*]|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[0-9]+)?)* +([*]|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[0-9]+)?(,([*]|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[0-9]+)?)* +([*]|([1-9]|0[1-9]|[12][0-9]|3[01]|[?])(-([1-9]|0[1-9]|[12][0-9]|3[01]|[?]))?)(/[0-9]+)?(,([*]|([1-9]|0[1-9]|[12][0-9]|3[01]|[?])(-([1-9]|0[1-9]|[12][0-9]|3[01]|[?]))?)(/[0-9]+)?)* +([*]|([1-9]|0[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-([1-9]|0[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[0-9]+)?(,([*]|([1-9]|0[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-([1-9]|0[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[0-9]+)?)* +([*]|([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)|[?])(-([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)|[?]))?)(/[0-9]+)?(,([*]|([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)|[?])(-([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)|[?]))?)(/[0-9]+)?)*$')",message="cleanup.schedule has a field out of range: minute 0-59, hour 0-23, day of month 1-31, month 1-12 or jan-dec, day of week 0-7 or sun-sat (each *, a value, a range a-b, a step /n, or a list)"
	Schedule string `json:"schedule,omitempty"`

	// retention is how long dispatched rows are kept, between 1m and 8760h
	// (a year).
	// +optional
	// +kubebuilder:default="72h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('8760h')",message="cleanup.retention must be between 1m and 8760h"
	Retention *metav1.Duration `json:"retention,omitempty"`

	// batchSize is the number of rows one DELETE statement removes.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	BatchSize int32 `json:"batchSize,omitempty"`

	// suspend stops scheduling cleanups; a running one finishes.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
}

// CleanupMode says when a dispatched row is deleted.
// +kubebuilder:validation:Enum=AfterRetention;OnDispatch
type CleanupMode string

// The cleanup modes.
const (
	// CleanupAfterRetention marks rows dispatched; the CronJob deletes them
	// after the retention.
	CleanupAfterRetention CleanupMode = "AfterRetention"
	// CleanupOnDispatch deletes rows in the transaction that publishes them.
	CleanupOnDispatch CleanupMode = "OnDispatch"
)

// BacklogSpec says how the operator measures the backlog: the count of
// undispatched rows and the age of the oldest.
type BacklogSpec struct {
	// checkInterval is the time between two measurements, between 1s and 1h.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="backlog.checkInterval must be between 1s and 1h"
	CheckInterval *metav1.Duration `json:"checkInterval,omitempty"`

	// stalledAfter is the age of the oldest undispatched row past which the
	// backlog counts as stalled (condition BacklogHealthy False, reason
	// BacklogStalled), between 10s and 168h.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('168h')",message="backlog.stalledAfter must be between 10s and 168h"
	StalledAfter *metav1.Duration `json:"stalledAfter,omitempty"`
}

// Source says where the relays read the outbox from.
// +kubebuilder:validation:Enum=Polling;LogicalReplication
type Source string

// The sources.
const (
	// SourcePolling claims batches of rows from the table and marks them
	// dispatched (or deletes them, cleanup.mode OnDispatch).
	SourcePolling Source = "Polling"
	// SourceLogicalReplication streams the table's inserts from a
	// PostgreSQL logical replication slot, in commit order.
	SourceLogicalReplication Source = "LogicalReplication"
)

// LogicalReplicationSpec shapes a relay whose source is LogicalReplication.
type LogicalReplicationSpec struct {
	// maxRetainedWAL is how much WAL the replication slot may make the
	// server keep before the condition ReplicationSlotHealthy turns False
	// (reason SlotRetainingWAL): a slot keeps every WAL segment from the
	// oldest position its relay has not confirmed, so a stopped or slow
	// relay grows the server's pg_wal directory. A quantity of bytes
	// (512Mi, 1Gi, 20Gi). It only warns; bound the WAL itself with the
	// server's max_slot_wal_keep_size (docs/operations.md).
	// +optional
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="logicalReplication.maxRetainedWAL must be a positive quantity of bytes, e.g. 1Gi"
	MaxRetainedWAL *resource.Quantity `json:"maxRetainedWAL,omitempty"`
}

// OutboxRelaySpec is the desired state of an OutboxRelay.
// +kubebuilder:validation:XValidation:rule="!has(self.cleanup.mode) || self.cleanup.mode != 'OnDispatch' || !has(self.redis.autoReplay) || !self.redis.autoReplay",message="cleanup.mode OnDispatch deletes the rows that redis.autoReplay would republish: use one or the other"
// +kubebuilder:validation:XValidation:rule="!has(self.ordering) || self.ordering != 'PerKey' || has(self.postgres.columns.key)",message="ordering PerKey needs postgres.columns.key: the column whose events are ordered per value"
// +kubebuilder:validation:XValidation:rule="!has(self.source) || self.source != 'LogicalReplication' || !has(self.cleanup.mode) || self.cleanup.mode != 'OnDispatch'",message="source LogicalReplication reads the rows from the WAL and never claims them, so there is nothing for cleanup.mode OnDispatch to delete: leave cleanup.mode at AfterRetention"
// +kubebuilder:validation:XValidation:rule="!has(self.source) || self.source != 'LogicalReplication' || !has(self.ordering) || self.ordering != 'PerKey'",message="source LogicalReplication has one reader per slot, in commit order: ordering PerKey (key partitions over many relays) does not apply; use None or Strict"
type OutboxRelaySpec struct {
	// postgres says where the outbox table is.
	// +required
	Postgres PostgresSpec `json:"postgres"`

	// redis says where the events go.
	// +required
	Redis RedisSpec `json:"redis"`

	// relay shapes the relay pods.
	// +optional
	// +kubebuilder:default={}
	Relay RelaySpec `json:"relay,omitempty"`

	// replicas sets how many relays run, from the backlog.
	// +optional
	// +kubebuilder:default={}
	Replicas ReplicasSpec `json:"replicas,omitempty"`

	// cleanup says when dispatched rows are deleted, and shapes the CronJob
	// that deletes them after the retention.
	// +optional
	// +kubebuilder:default={}
	Cleanup CleanupSpec `json:"cleanup,omitempty"`

	// backlog says how the backlog is measured.
	// +optional
	// +kubebuilder:default={}
	Backlog BacklogSpec `json:"backlog,omitempty"`

	// suspend scales the relays to zero and keeps everything else: the
	// Deployment, the cleanup CronJob and the backlog measurements.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// ordering is what the relays promise about the order of the stream.
	// None (the default, the throughput mode): any number of relays, several
	// batches in flight, no order promised across batches. Strict: one relay
	// is active at a time (the leader, fenced by a PostgreSQL advisory lock
	// and an epoch checked by Redis), the other replicas are warm standbys
	// that take over within seconds, a rollout hands over without overlap,
	// and the stream receives the events in (created_at, id) order of the
	// rows committed when they are claimed; extra replicas add standbys, not
	// throughput. PerKey: the same promise per value of postgres.columns.key,
	// with many relays: the keys are hashed into 32 partitions, each owned
	// and drained in order by one relay at a time, rebalanced as the
	// Deployment scales. Changing it rolls the relays; until the old pods
	// are gone the old mode's promise applies. docs/relay.md, "Ordering".
	// +optional
	// +kubebuilder:default=None
	Ordering Ordering `json:"ordering,omitempty"`

	// source is where the relays read the outbox from. Polling (the
	// default): they claim batches of pending rows (FOR UPDATE SKIP LOCKED)
	// and mark them dispatched. LogicalReplication: they stream the table's
	// inserts from a PostgreSQL logical replication slot (pgoutput; the
	// server needs wal_level=logical and the DSN's role REPLICATION), in
	// commit order, and confirm the slot's position once Redis acknowledged
	// them; rows are never marked dispatched (the cleanup CronJob deletes
	// them by age behind the slot's progress, or the application deletes
	// them itself), and one relay reads at a time (more replicas are warm
	// standbys). A new slot's relay first publishes, from the table, the
	// rows committed before the slot existed (a catch-up). The operator names the
	// slot (status.replication.slotName), reports its WAL (condition
	// ReplicationSlotHealthy) and drops it when the OutboxRelay is deleted
	// (finalizer relay.outbox.dev/replication-slot). It excludes
	// cleanup.mode OnDispatch, redis.autoReplay and ordering PerKey. It
	// cannot change on a live relay: create a new OutboxRelay instead.
	// docs/relay.md, "Logical replication".
	// +optional
	// +kubebuilder:default=Polling
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source cannot change on a live relay (switching away from LogicalReplication would leave its slot retaining WAL and every streamed row unmarked, for polling to publish again): create a new OutboxRelay"
	Source Source `json:"source,omitempty"`

	// logicalReplication shapes the relays of source LogicalReplication;
	// ignored with source Polling.
	// +optional
	// +kubebuilder:default={}
	LogicalReplication LogicalReplicationSpec `json:"logicalReplication,omitempty"`
}

// Ordering is what the relays of an OutboxRelay promise about the order of
// the stream.
// +kubebuilder:validation:Enum=None;Strict;PerKey
type Ordering string

// The orderings.
const (
	// OrderingNone promises no order across batches: the throughput mode.
	OrderingNone Ordering = "None"
	// OrderingStrict runs one fenced leader; the stream is in claim order.
	OrderingStrict Ordering = "Strict"
	// OrderingPerKey runs fenced owners of key partitions; each key's events
	// are in claim order.
	OrderingPerKey Ordering = "PerKey"
)

// OutboxRelayStatus is the observed state of an OutboxRelay.
type OutboxRelayStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// backlog is the count of undispatched rows at lastBacklogCheckTime.
	// +optional
	Backlog *int64 `json:"backlog,omitempty"`

	// backlogCapped reports that backlog is a lower bound: the operator
	// stops counting at its --backlog-count-limit (default 1,000,000), so
	// that a huge backlog is still measured within the statement timeout;
	// the backlog is at least that many rows.
	// +optional
	BacklogCapped bool `json:"backlogCapped,omitempty"`

	// oldestPendingTime is the created_at of the oldest undispatched row at
	// lastBacklogCheckTime; absent when none was pending.
	// +optional
	OldestPendingTime *metav1.Time `json:"oldestPendingTime,omitempty"`

	// lastBacklogCheckTime is when the backlog was last measured successfully.
	// +optional
	LastBacklogCheckTime *metav1.Time `json:"lastBacklogCheckTime,omitempty"`

	// deadLetters is the count of rows parked in the dead-letter table
	// (<table>_dead_letters, beside the outbox table) at lastBacklogCheckTime,
	// because they cannot be published (a NULL column, a payload too large,
	// refused by Redis). They are kept until a person retries or discards
	// them with `relay dead-letters`, and are not part of backlog.
	// +optional
	DeadLetters *int64 `json:"deadLetters,omitempty"`

	// desiredReplicas is the number of relays the operator asks the
	// Deployment for: from the backlog, between replicas.min and
	// replicas.max, after the scale-down stabilisation window; zero when
	// suspended.
	// +optional
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`

	// replicas is the number of relay pods that exist.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// readyReplicas is the number of relay pods that are ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// replicaSummary is readyReplicas/desiredReplicas, for display.
	// +optional
	ReplicaSummary string `json:"replicaSummary,omitempty"`

	// selector is the label selector of the relay pods, as a string: the
	// scale subresource's, which an HPA needs.
	// +optional
	Selector string `json:"selector,omitempty"`

	// scaleDownPendingSince is when the backlog started asking for fewer
	// relays than desiredReplicas; the relays are scaled down once that has
	// lasted replicas.scaleDownStabilizationWindow. Absent when no scale-down
	// is pending.
	// +optional
	ScaleDownPendingSince *metav1.Time `json:"scaleDownPendingSince,omitempty"`

	// lastCleanupTime is when the cleanup job last completed successfully.
	// +optional
	LastCleanupTime *metav1.Time `json:"lastCleanupTime,omitempty"`

	// replication is the replication slot of a relay with source
	// LogicalReplication, as the last backlog check read it from
	// pg_replication_slots; absent with source Polling.
	// +optional
	Replication *ReplicationStatus `json:"replication,omitempty"`

	// conditions: Ready sums up SecretsResolved, DatabaseReachable,
	// BacklogHealthy and RelaysAvailable; its reason is the first thing that
	// is wrong. DeadLettersClear reports parked rows and leaves Ready alone:
	// the relays keep publishing the rows behind them.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ReplicationStatus is the replication slot of a relay with source
// LogicalReplication. The sizes are bytes of WAL, measured against the
// server's current WAL position at lastBacklogCheckTime.
type ReplicationStatus struct {
	// slotName is the logical replication slot the relays stream from:
	// outbox_<namespace>_<name>, lower-cased, every character other than
	// a-z, 0-9 and _ turned into _, cut to fit PostgreSQL's 63 bytes, and a
	// hash of the namespace and name appended (slot names are per server:
	// two OutboxRelays never share one). The relays create it.
	SlotName string `json:"slotName"`

	// slotExists is false while the slot does not exist (the relays create
	// it when they start, and again after it was dropped by hand).
	// +optional
	SlotExists bool `json:"slotExists,omitempty"`

	// active reports that a relay streams from the slot now.
	// +optional
	Active bool `json:"active,omitempty"`

	// walStatus is PostgreSQL's pg_replication_slots.wal_status: reserved
	// (within max_wal_size), extended (past it, still kept), unreserved (to
	// be removed at the next checkpoint) or lost (removed: the slot is
	// invalidated, and the relays recreate it and catch up from the table).
	// +optional
	WALStatus string `json:"walStatus,omitempty"`

	// retainedBytes is the WAL the slot makes the server keep: from its
	// restart_lsn to the current position.
	// +optional
	RetainedBytes *int64 `json:"retainedBytes,omitempty"`

	// lagBytes is the WAL written since the position the relays last
	// confirmed (confirmed_flush_lsn).
	// +optional
	LagBytes *int64 `json:"lagBytes,omitempty"`

	// safeWALSizeBytes is how much more WAL the server can write before
	// the slot is invalidated (pg_replication_slots.safe_wal_size); absent
	// when max_slot_wal_keep_size is unset.
	// +optional
	SafeWALSizeBytes *int64 `json:"safeWALSizeBytes,omitempty"`

	// maxSlotWALKeepSizeBytes is the server's max_slot_wal_keep_size in
	// bytes, -1 when it is unset (the default): then nothing bounds the
	// WAL a slot keeps, and a stopped relay can fill the server's disk.
	// +optional
	MaxSlotWALKeepSizeBytes *int64 `json:"maxSlotWALKeepSizeBytes,omitempty"`
}

// OutboxRelay runs transactional-outbox relays that move the rows of a
// PostgreSQL outbox table to a Redis stream, scaled by the backlog, with a
// CronJob that deletes dispatched rows.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas.count,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=obr,categories=outbox
// +kubebuilder:printcolumn:name="Stream",type=string,JSONPath=`.spec.redis.stream`
// +kubebuilder:printcolumn:name="Backlog",type=integer,JSONPath=`.status.backlog`
// +kubebuilder:printcolumn:name="Oldest",type=date,JSONPath=`.status.oldestPendingTime`,description="Age of the oldest undispatched row"
// +kubebuilder:printcolumn:name="Dead-Letters",type=integer,JSONPath=`.status.deadLetters`,description="Rows parked in the dead-letter table",priority=1
// +kubebuilder:printcolumn:name="Replicas",type=string,JSONPath=`.status.replicaSummary`,description="Ready/desired relays"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Ordering",type=string,JSONPath=`.spec.ordering`,priority=1
// +kubebuilder:printcolumn:name="Scaling",type=string,JSONPath=`.spec.replicas.mode`,priority=1
// +kubebuilder:printcolumn:name="Slot",type=string,JSONPath=`.status.replication.slotName`,description="Replication slot (source LogicalReplication)",priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 44",message="metadata.name must be at most 44 characters, so that the CronJob <name>-cleanup fits the 52 characters Kubernetes allows"
type OutboxRelay struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +required
	Spec OutboxRelaySpec `json:"spec"`

	// status is the observed state, written by the operator.
	// +optional
	Status OutboxRelayStatus `json:"status,omitempty"`
}

// OutboxRelayList is a list of OutboxRelays.
//
// +kubebuilder:object:root=true
type OutboxRelayList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the OutboxRelays.
	Items []OutboxRelay `json:"items"`
}
