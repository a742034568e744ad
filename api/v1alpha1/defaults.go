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
	"cmp"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// The defaults the API server applies (the +kubebuilder:default markers of
// outboxrelay_types.go; a test checks that the generated CRD agrees, and
// pkg/contract's test that the table and stream defaults are the contract's). The
// getters below apply them too, so that code handed an object that never
// went through the API server (a unit test's fixture) sees the same values.
const (
	DefaultTable                       = contract.DefaultTable
	DefaultIDColumn                    = contract.DefaultIDColumn
	DefaultEventTypeColumn             = contract.DefaultEventTypeColumn
	DefaultPayloadColumn               = contract.DefaultPayloadColumn
	DefaultCreatedAtColumn             = contract.DefaultCreatedAtColumn
	DefaultDispatchedAtColumn          = contract.DefaultDispatchedAtColumn
	DefaultStream                      = contract.DefaultStream
	DefaultRelayBatchSize        int32 = 500
	DefaultPollInterval                = 500 * time.Millisecond
	DefaultLogLevel                    = "info"
	DefaultMinReplicas           int32 = 1
	DefaultMaxReplicas           int32 = 1
	DefaultTargetBacklogPerRelay int64 = 1000
	DefaultScaleDownWindow             = 5 * time.Minute
	DefaultCleanupSchedule             = "17 * * * *"
	DefaultRetention                   = 72 * time.Hour
	DefaultCleanupBatchSize      int32 = 1000
	DefaultBacklogCheckInterval        = 30 * time.Second
	DefaultBacklogStalledAfter         = 5 * time.Minute
	// DefaultMaxRetainedWAL is logicalReplication.maxRetainedWAL's default,
	// "1Gi", in bytes.
	DefaultMaxRetainedWAL int64 = 1 << 30
)

// durationOr returns d, or def when d is nil or zero.
func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil || d.Duration == 0 {
		return def
	}
	return d.Duration
}

// GetTable is postgres.table, defaulted.
func (s *PostgresSpec) GetTable() string { return cmp.Or(s.Table, DefaultTable) }

// GetStream is redis.stream, defaulted.
func (s *RedisSpec) GetStream() string { return cmp.Or(s.Stream, DefaultStream) }

// GetBatchSize is relay.batchSize, defaulted.
func (s *RelaySpec) GetBatchSize() int32 { return cmp.Or(s.BatchSize, DefaultRelayBatchSize) }

// GetPollInterval is relay.pollInterval, defaulted.
func (s *RelaySpec) GetPollInterval() time.Duration {
	return durationOr(s.PollInterval, DefaultPollInterval)
}

// GetLogLevel is relay.logLevel, defaulted.
func (s *RelaySpec) GetLogLevel() string { return cmp.Or(s.LogLevel, DefaultLogLevel) }

// GetMin is replicas.min, defaulted.
func (s *ReplicasSpec) GetMin() int32 {
	if s.Min == nil {
		return DefaultMinReplicas
	}
	return *s.Min
}

// External reports whether an autoscaler, not the operator, sets the
// number of relays (replicas.mode External).
func (s *ReplicasSpec) External() bool { return s.Mode == ReplicasModeExternal }

// GetMax is replicas.max, defaulted, and never below GetMin.
func (s *ReplicasSpec) GetMax() int32 { return max(cmp.Or(s.Max, DefaultMaxReplicas), s.GetMin()) }

// GetTargetBacklogPerReplica is replicas.targetBacklogPerReplica, defaulted.
func (s *ReplicasSpec) GetTargetBacklogPerReplica() int64 {
	return cmp.Or(s.TargetBacklogPerReplica, DefaultTargetBacklogPerRelay)
}

// GetScaleDownStabilizationWindow is replicas.scaleDownStabilizationWindow,
// defaulted. An explicit 0s is kept: it turns the window off.
func (s *ReplicasSpec) GetScaleDownStabilizationWindow() time.Duration {
	if s.ScaleDownStabilizationWindow == nil {
		return DefaultScaleDownWindow
	}
	return s.ScaleDownStabilizationWindow.Duration
}

// GetSchedule is cleanup.schedule, defaulted.
func (s *CleanupSpec) GetSchedule() string { return cmp.Or(s.Schedule, DefaultCleanupSchedule) }

// GetRetention is cleanup.retention, defaulted.
func (s *CleanupSpec) GetRetention() time.Duration { return durationOr(s.Retention, DefaultRetention) }

// GetMode is cleanup.mode, defaulted.
func (s *CleanupSpec) GetMode() CleanupMode { return cmp.Or(s.Mode, CleanupAfterRetention) }

// DeletesOnDispatch reports whether the relays delete the rows they publish
// (and no CronJob runs).
func (s *CleanupSpec) DeletesOnDispatch() bool { return s.GetMode() == CleanupOnDispatch }

// GetBatchSize is cleanup.batchSize, defaulted.
func (s *CleanupSpec) GetBatchSize() int32 { return cmp.Or(s.BatchSize, DefaultCleanupBatchSize) }

// GetCheckInterval is backlog.checkInterval, defaulted.
func (s *BacklogSpec) GetCheckInterval() time.Duration {
	return durationOr(s.CheckInterval, DefaultBacklogCheckInterval)
}

// GetStalledAfter is backlog.stalledAfter, defaulted.
func (s *BacklogSpec) GetStalledAfter() time.Duration {
	return durationOr(s.StalledAfter, DefaultBacklogStalledAfter)
}

// GetColumns returns the column names, defaulted.
func (c *OutboxColumns) GetColumns() OutboxColumns {
	return OutboxColumns{
		ID:           cmp.Or(c.ID, DefaultIDColumn),
		EventType:    cmp.Or(c.EventType, DefaultEventTypeColumn),
		Payload:      cmp.Or(c.Payload, DefaultPayloadColumn),
		CreatedAt:    cmp.Or(c.CreatedAt, DefaultCreatedAtColumn),
		DispatchedAt: cmp.Or(c.DispatchedAt, DefaultDispatchedAtColumn),
		Key:          c.Key,
	}
}

// GetSource is spec.source, defaulted.
func (s *OutboxRelaySpec) GetSource() Source { return cmp.Or(s.Source, SourcePolling) }

// ReadsLogicalReplication reports whether the relays stream from a
// replication slot (source LogicalReplication): one reader at a time, no
// rows marked dispatched, no cleanup CronJob, a slot to drop on deletion.
func (s *OutboxRelaySpec) ReadsLogicalReplication() bool {
	return s.GetSource() == SourceLogicalReplication
}

// GetMaxRetainedWAL is logicalReplication.maxRetainedWAL in bytes,
// defaulted.
func (s *LogicalReplicationSpec) GetMaxRetainedWAL() int64 {
	if s.MaxRetainedWAL == nil || s.MaxRetainedWAL.Sign() <= 0 {
		return DefaultMaxRetainedWAL
	}
	return s.MaxRetainedWAL.Value()
}
