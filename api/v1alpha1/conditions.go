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

// ConditionType is the type of one of an OutboxRelay's status conditions.
type ConditionType string

// The condition types of an OutboxRelay. Ready sums up the others, except
// DeadLettersClear.
const (
	// ConditionReady is True when the relays run as specified: the Secrets
	// resolve, the database answers, the backlog is not stalled and every
	// desired relay is available. When False or Unknown, its reason is the
	// first of the other conditions' failure reasons, in the order the
	// controller checks them (see docs/controller.md).
	ConditionReady ConditionType = "Ready"

	// ConditionSecretsResolved is True when the DSN and Redis URL Secrets
	// exist in the OutboxRelay's namespace, have the referenced keys and hold
	// values of the right shape.
	ConditionSecretsResolved ConditionType = "SecretsResolved"

	// ConditionDatabaseReachable is True when the last backlog check reached
	// the database and found the outbox table and its columns.
	ConditionDatabaseReachable ConditionType = "DatabaseReachable"

	// ConditionBacklogHealthy is True when the oldest undispatched row is
	// younger than backlog.stalledAfter.
	ConditionBacklogHealthy ConditionType = "BacklogHealthy"

	// ConditionRelaysAvailable is True when the Deployment has rolled out
	// and has as many available relays as desiredReplicas.
	ConditionRelaysAvailable ConditionType = "RelaysAvailable"

	// ConditionDeadLettersClear is True when the dead-letter table beside the
	// outbox table holds no parked row (or does not exist), False when rows
	// wait there for a person to retry or discard them. It is not part of
	// Ready: parked rows no longer hold up the relays, which keep publishing
	// the rows behind them.
	ConditionDeadLettersClear ConditionType = "DeadLettersClear"

	// ConditionRedisDurable is True when the Redis server that holds the
	// stream keeps what it acknowledged (a master, no eviction under a
	// maxmemory, AOF with appendfsync always or everysec), False with a
	// reason per risk, Unknown when the operator could not check (Redis
	// unreachable, CONFIG and INFO denied). The operator runs the Redis
	// checks of `relay doctor` itself. Not part of Ready: the relays keep
	// publishing; a person decides.
	ConditionRedisDurable ConditionType = "RedisDurable"

	// ConditionStreamIntact is True when no relay has recorded that the
	// stream lost entries it had added (a stream reset: Redis restarted
	// without persistence, was flushed, failed over to a lagging replica or
	// evicted the stream) that a replay has not covered yet, False with the
	// window of dispatch times to replay (`relay replay --pending`). Read by
	// the backlog check from <table>_stream_resets. Not part of Ready: the
	// relays keep publishing.
	ConditionStreamIntact ConditionType = "StreamIntact"

	// ConditionReplicationSlotHealthy, only with source LogicalReplication,
	// is True when the relays' replication slot exists, keeps less WAL than
	// logicalReplication.maxRetainedWAL and the server bounds what a slot
	// may keep (max_slot_wal_keep_size); False with a reason per risk;
	// Unknown before the relays created the slot, or when the backlog check
	// failed. Read by the backlog check from pg_replication_slots. Only
	// SlotRetainingWAL (and a slot that cannot be dropped on deletion) make
	// Ready False: the others are warnings, and the relays recover from an
	// invalidated slot by themselves.
	ConditionReplicationSlotHealthy ConditionType = "ReplicationSlotHealthy"
)

// Reason is the machine-readable reason of a condition: UpperCamelCase, and
// also the reason of the Event emitted when a condition changes to it.
type Reason string

// Reasons of the Ready condition when nothing is wrong, and of the other
// conditions when they are True.
const (
	// ReasonRelaysReady: Ready is True.
	ReasonRelaysReady Reason = "RelaysReady"
	// ReasonSecretsResolved: both Secrets and keys were found.
	ReasonSecretsResolved Reason = "SecretsResolved"
	// ReasonBacklogMeasured: the last backlog check succeeded.
	ReasonBacklogMeasured Reason = "BacklogMeasured"
	// ReasonBacklogWithinLimit: no undispatched row is older than
	// backlog.stalledAfter.
	ReasonBacklogWithinLimit Reason = "BacklogWithinLimit"
	// ReasonRelaysAvailable: every desired relay is available.
	ReasonRelaysAvailable Reason = "RelaysAvailable"
	// ReasonNoDeadLetters: the last backlog check found no parked row.
	ReasonNoDeadLetters Reason = "NoDeadLetters"
	// ReasonNoStreamReset: no stream reset waits for a replay.
	ReasonNoStreamReset Reason = "NoStreamReset"
)

// Reasons that say what is wrong. Each one names exactly one cause, so that
// a user (or an alert) can act on the reason alone; the message adds the
// details, never a password or a connection string.
const (
	// ReasonSecretNotFound: a referenced Secret does not exist in the
	// OutboxRelay's namespace. Creating it recovers without further action.
	ReasonSecretNotFound Reason = "SecretNotFound"
	// ReasonSecretKeyMissing: a referenced Secret exists but lacks the key,
	// or the value under it is empty.
	ReasonSecretKeyMissing Reason = "SecretKeyMissing"
	// ReasonDSNInvalid: the value under postgres.dsnSecretRef is not a
	// PostgreSQL connection string.
	ReasonDSNInvalid Reason = "DSNInvalid"
	// ReasonDSNKeyNotAllowed: the DSN sets a key the operator does not
	// honour when it measures the backlog: a key that reads files of the
	// operator's pod (service, servicefile, passfile, sslkey, sslcert,
	// sslrootcert, sslcrl, sslcrldir), unless the manager runs with
	// --allow-dsn-file-keys, or a key it does not know. The message names
	// the key. The relays still use the DSN; the backlog is not measured.
	ReasonDSNKeyNotAllowed Reason = "DSNKeyNotAllowed"
	// ReasonRedisURLInvalid: the value under redis.urlSecretRef is not a
	// redis:// or rediss:// URL.
	ReasonRedisURLInvalid Reason = "RedisURLInvalid"
	// ReasonInvalidSpec: the spec passed admission but cannot be used (for
	// example, the outbox layout was refused by the operator's own checks).
	ReasonInvalidSpec Reason = "InvalidSpec"
	// ReasonTableShared: another OutboxRelay of the namespace relays the
	// same table with the same DSN Secret key, or the backlog check found
	// in <table>_relays relays of other streams or of the other source seen
	// within 30s (of any namespace, Secret or cluster); the relays of one
	// table split its rows between their streams. The message names the
	// others (OutboxRelays, or streams and slots).
	ReasonTableShared Reason = "TableShared"
	// ReasonDeploymentFailed: the relay Deployment could not be created or
	// updated; the message has the API server's answer.
	ReasonDeploymentFailed Reason = "DeploymentFailed"
	// ReasonCronJobFailed: the cleanup CronJob could not be created or
	// updated; the message has the API server's answer.
	ReasonCronJobFailed Reason = "CronJobFailed"
	// ReasonBacklogCheckPending: the backlog has not been measured yet for
	// the current Secrets and layout (status Unknown).
	ReasonBacklogCheckPending Reason = "BacklogCheckPending"
	// ReasonDatabaseUnreachable: the backlog check could not connect to
	// PostgreSQL, or timed out, or the server refused the query.
	ReasonDatabaseUnreachable Reason = "DatabaseUnreachable"
	// ReasonOutboxTableNotFound: the database has no such table (or schema).
	ReasonOutboxTableNotFound Reason = "OutboxTableNotFound"
	// ReasonOutboxColumnNotFound: the table lacks one of the configured
	// columns.
	ReasonOutboxColumnNotFound Reason = "OutboxColumnNotFound"
	// ReasonBacklogStalled: the oldest undispatched row is older than
	// backlog.stalledAfter.
	ReasonBacklogStalled Reason = "BacklogStalled"
	// ReasonBacklogUnknown: the backlog could not be measured, so whether it
	// is stalled is unknown (status Unknown).
	ReasonBacklogUnknown Reason = "BacklogUnknown"
	// ReasonReconcilePaused: the annotation relay.outbox.dev/reconcile is
	// "disabled": the operator writes nothing to the Deployment and the
	// CronJob (they keep running as they are) and goes on measuring the
	// backlog. Removing the annotation resumes.
	ReasonReconcilePaused Reason = "ReconcilePaused"
	// ReasonSuspended: spec.suspend is true; the relays are scaled to zero.
	ReasonSuspended Reason = "Suspended"
	// ReasonRelaysProgressing: fewer relays are available (or up to date)
	// than desired, for example during a rollout or a scale-up.
	ReasonRelaysProgressing Reason = "RelaysProgressing"
	// ReasonDeadLettersPresent: rows that cannot be published are parked in
	// the dead-letter table. They stay there until a person lists them
	// (`relay dead-letters list`), then retries or discards them.
	ReasonDeadLettersPresent Reason = "DeadLettersPresent"
	// ReasonStreamReset: a relay found that the stream lost entries it had
	// added; the message has the window of dispatch times whose events may
	// be missing, and the replay command.
	ReasonStreamReset Reason = "StreamReset"
)

// Reasons of the RedisDurable condition (the same strings as the reasons
// of `relay doctor`'s Redis checks).
const (
	// ReasonRedisDurable: the server is a master that evicts nothing and
	// writes an append-only file with appendfsync always or everysec.
	ReasonRedisDurable Reason = "RedisDurable"
	// ReasonRedisCheckPending: the Redis checks have not run yet (Unknown).
	ReasonRedisCheckPending Reason = "RedisCheckPending"
	// ReasonRedisEvictionUnsafe: maxmemory is set and maxmemory-policy is
	// not noeviction, so Redis may evict the stream when memory is full.
	ReasonRedisEvictionUnsafe Reason = "RedisEvictionUnsafe"
	// ReasonRedisPersistenceOff: neither AOF nor RDB snapshots: a restart
	// of Redis loses every entry.
	ReasonRedisPersistenceOff Reason = "RedisPersistenceOff"
	// ReasonRedisPersistenceWeak: RDB snapshots only: a restart loses the
	// entries added since the last snapshot.
	ReasonRedisPersistenceWeak Reason = "RedisPersistenceWeak"
	// ReasonRedisFsyncLax: AOF with appendfsync no: a crash of the host
	// loses what the OS had not written yet.
	ReasonRedisFsyncLax Reason = "RedisFsyncLax"
	// ReasonRedisReadOnlyReplica: the URL names a replica, which refuses
	// writes.
	ReasonRedisReadOnlyReplica Reason = "RedisReadOnlyReplica"
	// ReasonRedisCheckUnknown: a setting could not be read (CONFIG denied
	// or renamed, INFO denied): Unknown; the message says how to check by
	// hand.
	ReasonRedisCheckUnknown Reason = "RedisCheckUnknown"
	// ReasonRedisUnreachable: the operator could not reach Redis (Unknown).
	ReasonRedisUnreachable Reason = "RedisUnreachable"
	// ReasonRedisAuthFailed: Redis refused the URL's credentials (Unknown).
	ReasonRedisAuthFailed Reason = "RedisAuthFailed"
)

// Reasons of the ReplicationSlotHealthy condition (source
// LogicalReplication).
const (
	// ReasonSlotHealthy: the slot exists, keeps less WAL than
	// logicalReplication.maxRetainedWAL, and max_slot_wal_keep_size bounds
	// it.
	ReasonSlotHealthy Reason = "SlotHealthy"
	// ReasonSlotMissing: the slot does not exist yet; the relays create it
	// when they start (Unknown).
	ReasonSlotMissing Reason = "SlotMissing"
	// ReasonSlotInvalidated: the server removed WAL the slot still needed
	// (wal_status lost: it kept more than max_slot_wal_keep_size). The
	// relays drop and recreate it and catch up from the table: events are
	// not lost, but duplicates are likely. The message says so.
	ReasonSlotInvalidated Reason = "SlotInvalidated"
	// ReasonSlotRetainingWAL: the slot keeps more WAL than
	// logicalReplication.maxRetainedWAL (a relay stopped, slow, or unable
	// to confirm); the message has both sizes. Ready is False.
	ReasonSlotRetainingWAL Reason = "SlotRetainingWAL"
	// ReasonSlotWALUnbounded: the server's max_slot_wal_keep_size is unset
	// (-1, the default), so a slot whose relay stopped keeps WAL until the
	// server's disk is full; the message says what to set. A warning: Ready
	// stays as it is.
	ReasonSlotWALUnbounded Reason = "SlotWALUnbounded"
	// ReasonSlotDropPending: the OutboxRelay is being deleted; the relays
	// are being stopped before the slot is dropped.
	ReasonSlotDropPending Reason = "SlotDropPending"
	// ReasonSlotDropFailed: the OutboxRelay is being deleted and its slot
	// could not be dropped (the database unreachable, the Secret gone); the
	// finalizer stays and the drop is retried with backoff. The message
	// says how to drop the slot and remove the finalizer by hand.
	ReasonSlotDropFailed Reason = "SlotDropFailed"
	// ReasonSlotDropped: the slot was dropped on deletion (an Event).
	ReasonSlotDropped Reason = "SlotDropped"
)

// Reasons of Events that are no condition's reason.
const (
	// ReasonScaled: the desired number of relays changed.
	ReasonScaled Reason = "Scaled"
)

// IsFailure reports whether a reason says that something is wrong, which
// makes its Event a Warning.
func (r Reason) IsFailure() bool {
	switch r {
	case ReasonRelaysReady, ReasonSecretsResolved, ReasonBacklogMeasured, ReasonBacklogWithinLimit,
		ReasonRelaysAvailable, ReasonBacklogCheckPending, ReasonBacklogUnknown, ReasonSuspended,
		ReasonRelaysProgressing, ReasonScaled, ReasonNoDeadLetters, ReasonRedisDurable, ReasonRedisCheckPending, ReasonNoStreamReset,
		ReasonSlotHealthy, ReasonSlotMissing, ReasonSlotDropPending, ReasonSlotDropped:
		return false
	}
	return true
}

// AnnotationReconcile on an OutboxRelay set to ReconcileDisabled pauses the
// operator's writes to its children (an incident, work on the Deployment by
// hand); Ready is False with reason ReconcilePaused while it is set.
const (
	AnnotationReconcile = "relay.outbox.dev/reconcile"
	ReconcileDisabled   = "disabled"
)

// FinalizerReplicationSlot is on every OutboxRelay of source
// LogicalReplication: on deletion the operator stops the relays, drops the
// replication slot (which would otherwise keep WAL on the server for good),
// then removes the finalizer.
const FinalizerReplicationSlot = "relay.outbox.dev/replication-slot"
