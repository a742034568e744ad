package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// rawRelay is an OutboxRelay as a user writes it: only the required fields,
// plus the path/value pairs of the case.
func rawRelay(ns, name string, set map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "OutboxRelay",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"postgres": map[string]any{"dsnSecretRef": map[string]any{"name": "db", "key": "dsn"}},
			"redis":    map[string]any{"urlSecretRef": map[string]any{"name": "redis", "key": "url"}},
		},
	}}
	for path, v := range set {
		if err := unstructured.SetNestedField(u.Object, v, strings.Split(path, ".")...); err != nil {
			panic(err)
		}
	}
	return u
}

func testAdmissionRejectsInvalidRelays(t *testing.T, s *suite) {
	ns := s.namespace(t)
	cases := []struct {
		name string
		set  map[string]any
		// want are substrings of the API server's answer: the field and
		// the message a user reads.
		want []string
	}{
		{"TableWithSQL", map[string]any{"spec.postgres.table": "x; DROP TABLE y"},
			[]string{"spec.postgres.table", "must be table or schema.table"}},
		{"TableWithTwoDots", map[string]any{"spec.postgres.table": "a.b.c"},
			[]string{"spec.postgres.table", "must be table or schema.table"}},
		{"TableTooLong", map[string]any{"spec.postgres.table": strings.Repeat("t", 64)},
			[]string{"spec.postgres.table", "at most 63 characters"}},
		{"ColumnStartsWithDigit", map[string]any{"spec.postgres.columns.payload": "1payload"},
			[]string{"spec.postgres.columns.payload", "must be a column name"}},
		{"ColumnsNotDistinct", map[string]any{"spec.postgres.columns.payload": "id"},
			[]string{"spec.postgres.columns", "columns must name five different columns"}},
		{"DeadLetterStreamIsTheStream", map[string]any{"spec.redis.stream": "orders", "spec.redis.deadLetterStream": "orders"},
			[]string{"spec.redis", "redis.deadLetterStream must differ from redis.stream"}},
		{"DeadLetterStreamIsTheDefaultStream", map[string]any{"spec.redis.deadLetterStream": "jobs"},
			[]string{"redis.deadLetterStream must differ from redis.stream"}},
		{"CronMinuteOutOfRange", map[string]any{"spec.cleanup.schedule": "61 * * * *"},
			[]string{"spec.cleanup.schedule", "cleanup.schedule has a field out of range"}},
		{"CronHourOutOfRange", map[string]any{"spec.cleanup.schedule": "0 24 * * *"},
			[]string{"cleanup.schedule has a field out of range"}},
		{"CronMonthOutOfRange", map[string]any{"spec.cleanup.schedule": "0 0 1 13 *"},
			[]string{"cleanup.schedule has a field out of range"}},
		{"PerKeyWithoutKey", map[string]any{"spec.ordering": "PerKey"},
			[]string{"ordering PerKey needs postgres.columns.key"}},
		{"KeyIsAnotherColumn", map[string]any{"spec.ordering": "PerKey", "spec.postgres.columns.key": "created_at"},
			[]string{"spec.postgres.columns", "columns.key must name a column other than the five others"}},
		{"CleanupModeUnknown", map[string]any{"spec.cleanup.mode": "Never"},
			[]string{"spec.cleanup.mode", "Unsupported value"}},
		{"OnDispatchWithAutoReplay", map[string]any{"spec.cleanup.mode": "OnDispatch", "spec.redis.autoReplay": true},
			[]string{"cleanup.mode OnDispatch deletes the rows that redis.autoReplay would republish"}},
		{"OrderingUnknown", map[string]any{"spec.ordering": "Sometimes"},
			[]string{"spec.ordering", "Unsupported value"}},
		{"SecretNameInvalid", map[string]any{"spec.postgres.dsnSecretRef.name": "Not_A_Name"},
			[]string{"spec.postgres.dsnSecretRef.name", "must be the name of a Secret"}},
		{"SecretKeyMissing", map[string]any{"spec.redis.urlSecretRef.key": ""},
			[]string{"spec.redis.urlSecretRef.key"}},
		{"StreamWithSpace", map[string]any{"spec.redis.stream": "my stream"},
			[]string{"spec.redis.stream", "must be a stream name"}},
		{"BatchSizeZero", map[string]any{"spec.relay.batchSize": int64(0)},
			[]string{"spec.relay.batchSize", "should be greater than or equal to 1"}},
		{"BatchSizeTooLarge", map[string]any{"spec.relay.batchSize": int64(20000)},
			[]string{"spec.relay.batchSize", "should be less than or equal to 10000"}},
		{"PollIntervalTooShort", map[string]any{"spec.relay.pollInterval": "1ms"},
			[]string{"spec.relay.pollInterval", "relay.pollInterval must be between 10ms and 1m"}},
		{"PollIntervalNotADuration", map[string]any{"spec.relay.pollInterval": "soon"},
			[]string{"spec.relay.pollInterval"}},
		{"MinAboveMax", map[string]any{"spec.replicas.min": int64(3), "spec.replicas.max": int64(2)},
			[]string{"spec.replicas.min", "replicas.min must not be greater than replicas.max"}},
		{"MinAboveDefaultMax", map[string]any{"spec.replicas.min": int64(2)},
			[]string{"replicas.min must not be greater than replicas.max"}},
		{"MaxTooLarge", map[string]any{"spec.replicas.max": int64(1000)},
			[]string{"spec.replicas.max", "should be less than or equal to 100"}},
		{"WindowTooLong", map[string]any{"spec.replicas.scaleDownStabilizationWindow": "2h"},
			[]string{"replicas.scaleDownStabilizationWindow must be between 0s and 1h"}},
		{"ScheduleOfThreeFields", map[string]any{"spec.cleanup.schedule": "* * *"},
			[]string{"spec.cleanup.schedule", "must be a cron expression of five fields"}},
		{"ScheduleMacro", map[string]any{"spec.cleanup.schedule": "@hourly"},
			[]string{"spec.cleanup.schedule", "must be a cron expression of five fields"}},
		{"ScheduleOfSixFields", map[string]any{"spec.cleanup.schedule": "0 0 * * * *"},
			[]string{"spec.cleanup.schedule", "must be a cron expression of five fields"}},
		{"RetentionTooShort", map[string]any{"spec.cleanup.retention": "30s"},
			[]string{"spec.cleanup.retention", "cleanup.retention must be between 1m and 8760h"}},
		{"CheckIntervalTooShort", map[string]any{"spec.backlog.checkInterval": "100ms"},
			[]string{"backlog.checkInterval must be between 1s and 1h"}},
		{"StalledAfterTooShort", map[string]any{"spec.backlog.stalledAfter": "1s"},
			[]string{"backlog.stalledAfter must be between 10s and 168h"}},
		{"LogLevelUnknown", map[string]any{"spec.relay.logLevel": "verbose"},
			[]string{"spec.relay.logLevel", "Unsupported value"}},
		{"EnvSetsDatabaseURL", map[string]any{"spec.relay.env": []any{map[string]any{"name": "DATABASE_URL", "value": "postgres://x"}}},
			[]string{"spec.relay.env", "relay.env must not set DATABASE_URL or REDIS_URL"}},
		// The operator passes --source, --slot and --cleanup-mode only when
		// they differ from the defaults, so these variables would fill them
		// in behind the spec. RELAY_SLOT on a Polling relay reaches its
		// cleanup container too: relay cleanup --slot deletes rows by age
		// whether dispatched or not.
		{"EnvSetsSlot", map[string]any{"spec.relay.env": []any{map[string]any{"name": "RELAY_SLOT", "value": "orders"}}},
			[]string{"spec.relay.env", "relay.env must not set RELAY_SOURCE, RELAY_SLOT or RELAY_CLEANUP_MODE"}},
		{"EnvSetsSource", map[string]any{"spec.relay.env": []any{map[string]any{"name": "RELAY_SOURCE", "value": "LogicalReplication"}}},
			[]string{"spec.relay.env", "relay.env must not set RELAY_SOURCE, RELAY_SLOT or RELAY_CLEANUP_MODE"}},
		{"EnvSetsCleanupMode", map[string]any{"spec.relay.env": []any{map[string]any{"name": "RELAY_CLEANUP_MODE", "value": "OnDispatch"}}},
			[]string{"spec.relay.env", "relay.env must not set RELAY_SOURCE, RELAY_SLOT or RELAY_CLEANUP_MODE"}},
		{"VolumeHostPath", map[string]any{"spec.relay.volumes": []any{map[string]any{"name": "host", "hostPath": map[string]any{"path": "/"}}}},
			[]string{"spec.relay.volumes", "the kinds the restricted Pod Security Standard admits"}},
		{"VolumeNamedRedisCA", map[string]any{"spec.relay.volumes": []any{map[string]any{"name": "redis-ca", "emptyDir": map[string]any{}}}},
			[]string{"spec.relay.volumes", "relay.volumes must not be named redis-ca"}},
		{"PodLabelOfTheOperator", map[string]any{"spec.relay.podMetadata.labels": map[string]any{"app.kubernetes.io/instance": "x"}},
			[]string{"spec.relay.podMetadata.labels", "must not set app.kubernetes.io/ labels"}},
		{"PodAnnotationOfTheOperator", map[string]any{"spec.relay.podMetadata.annotations": map[string]any{"relay.outbox.dev/secret-hash": "x"}},
			[]string{"spec.relay.podMetadata.annotations", "must not set relay.outbox.dev/ annotations"}},
		{"ServiceAccountNameInvalid", map[string]any{"spec.relay.serviceAccountName": "Not_A_Name"},
			[]string{"spec.relay.serviceAccountName"}},
		{"ExternalWithoutCount", map[string]any{"spec.replicas.mode": "External"},
			[]string{"spec.replicas.count", "replicas.count is required when replicas.mode is External"}},
		{"CountInOperatorMode", map[string]any{"spec.replicas.count": int64(2)},
			[]string{"spec.replicas.count", "replicas.count is only used when replicas.mode is External"}},
		{"ModeUnknown", map[string]any{"spec.replicas.mode": "KEDA"},
			[]string{"spec.replicas.mode", "Unsupported value"}},
		{"SourceUnknown", map[string]any{"spec.source": "Trigger"},
			[]string{"spec.source", "Unsupported value"}},
		{"LogicalReplicationWithOnDispatch", map[string]any{"spec.source": "LogicalReplication", "spec.cleanup.mode": "OnDispatch"},
			[]string{"source LogicalReplication reads the rows from the WAL", "cleanup.mode OnDispatch"}},
		{"LogicalReplicationWithPerKey", map[string]any{"spec.source": "LogicalReplication", "spec.ordering": "PerKey", "spec.postgres.columns.key": "aggregate_id"},
			[]string{"source LogicalReplication has one reader per slot", "ordering PerKey"}},
		{"BatchBytesTooSmall", map[string]any{"spec.relay.batchBytes": "1Ki"},
			[]string{"spec.relay.batchBytes", "relay.batchBytes must be between 64Ki and 1Gi"}},
		{"BatchBytesTooLarge", map[string]any{"spec.relay.batchBytes": "2Gi"},
			[]string{"spec.relay.batchBytes", "relay.batchBytes must be between 64Ki and 1Gi"}},
		{"MaxRetainedWALZero", map[string]any{"spec.logicalReplication.maxRetainedWAL": "0"},
			[]string{"spec.logicalReplication.maxRetainedWAL", "must be a positive quantity of bytes"}},
		{"MaxRetainedWALNegative", map[string]any{"spec.logicalReplication.maxRetainedWAL": "-1Gi"},
			[]string{"spec.logicalReplication.maxRetainedWAL", "must be a positive quantity of bytes"}},
		{"MaxRetainedWALNotAQuantity", map[string]any{"spec.logicalReplication.maxRetainedWAL": "lots"},
			[]string{"spec.logicalReplication.maxRetainedWAL"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := s.c.Create(context.Background(), rawRelay(ns, strings.ToLower(tc.name), tc.set))
			require.Error(t, err, "the API server accepted an invalid OutboxRelay")
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	t.Run("NameTooLong", func(t *testing.T) {
		t.Parallel()
		err := s.c.Create(context.Background(), rawRelay(ns, strings.Repeat("n", 45), nil))
		require.Error(t, err)
		require.Contains(t, err.Error(), "metadata.name must be at most 44 characters")
	})
	t.Run("MissingSecretRefs", func(t *testing.T) {
		t.Parallel()
		u := rawRelay(ns, "nodsn", nil)
		unstructured.RemoveNestedField(u.Object, "spec", "postgres", "dsnSecretRef")
		err := s.c.Create(context.Background(), u)
		require.Error(t, err)
		require.Contains(t, err.Error(), "spec.postgres.dsnSecretRef")
		require.Contains(t, err.Error(), "Required value")
	})
	t.Run("TableAndStreamCannotChange", func(t *testing.T) {
		t.Parallel()
		u := rawRelay(ns, "immutable", nil)
		require.NoError(t, s.c.Create(context.Background(), u))
		// patch merges one change (no resourceVersion: the controller writes
		// the object too) and returns the API server's answer.
		patch := func(body string) error {
			return s.c.Patch(context.Background(), u.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(body)))
		}
		for field, body := range map[string]string{
			"postgres.table": `{"spec":{"postgres":{"table":"other_events"}}}`,
			"redis.stream":   `{"spec":{"redis":{"stream":"other"}}}`,
		} {
			err := patch(body)
			require.Error(t, err, field)
			require.Contains(t, err.Error(), field+" cannot change on a live relay")
		}
		require.NoError(t, patch(`{"spec":{"relay":{"batchSize":100,"batchBytes":"4Mi"}}}`), "other fields still change")
	})
	t.Run("SourceCannotChange", func(t *testing.T) {
		t.Parallel()
		for name, set := range map[string]map[string]any{
			"source-polling": nil,
			"source-lr":      {"spec.source": "LogicalReplication", "spec.logicalReplication.maxRetainedWAL": "512Mi"},
		} {
			u := rawRelay(ns, name, set)
			require.NoError(t, s.c.Create(context.Background(), u), name)
			other := `{"spec":{"source":"LogicalReplication"}}`
			if set != nil {
				other = `{"spec":{"source":"Polling"}}`
			}
			err := s.c.Patch(context.Background(), u.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(other)))
			require.Error(t, err, name)
			require.Contains(t, err.Error(), "source cannot change on a live relay")
			require.Contains(t, err.Error(), "create a new OutboxRelay")
			require.NoError(t, s.c.Patch(context.Background(), u.DeepCopy(),
				client.RawPatch(types.MergePatchType, []byte(`{"spec":{"logicalReplication":{"maxRetainedWAL":"2Gi"}}}`))),
				"maxRetainedWAL still changes")
		}
	})
	t.Run("ValidEdgeValuesAreAccepted", func(t *testing.T) {
		t.Parallel()
		u := rawRelay(ns, strings.Repeat("v", 44), map[string]any{
			"spec.postgres.table":                        "app." + strings.Repeat("t", 63),
			"spec.replicas.min":                          int64(0),
			"spec.replicas.max":                          int64(100),
			"spec.replicas.scaleDownStabilizationWindow": "0s",
			"spec.cleanup.schedule":                      "*/15 0-6 1,15 JAN-MAR MON-FRI",
			"spec.relay.pollInterval":                    "10ms",
			"spec.redis.stream":                          "{tenant}:orders.events",
		})
		require.NoError(t, s.c.Create(context.Background(), u))
	})
	t.Run("LogicalReplicationWithAutoReplayIsAccepted", func(t *testing.T) {
		t.Parallel()
		u := rawRelay(ns, "slot-auto-replay", map[string]any{
			"spec.source":           "LogicalReplication",
			"spec.redis.autoReplay": true,
		})
		require.NoError(t, s.c.Create(context.Background(), u))
	})
	t.Run("PodExtrasAndExternalModeAreAccepted", func(t *testing.T) {
		t.Parallel()
		u := rawRelay(ns, "extras", map[string]any{
			"spec.replicas.mode":                 "External",
			"spec.replicas.count":                int64(0),
			"spec.relay.serviceAccountName":      "relay-identity",
			"spec.relay.priorityClassName":       "outbox-critical",
			"spec.relay.podMetadata.labels":      map[string]any{"team": "payments"},
			"spec.relay.podMetadata.annotations": map[string]any{"sidecar.istio.io/inject": "false"},
			"spec.relay.env":                     []any{map[string]any{"name": "PGSSLROOTCERT", "value": "/etc/pg-ca/ca.crt"}},
			"spec.relay.volumes":                 []any{map[string]any{"name": "pg-ca", "secret": map[string]any{"secretName": "pg-ca"}}},
			"spec.relay.volumeMounts":            []any{map[string]any{"name": "pg-ca", "mountPath": "/etc/pg-ca"}},
			"spec.relay.topologySpreadConstraints": []any{map[string]any{
				"maxSkew": int64(1), "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
			}},
		})
		require.NoError(t, s.c.Create(context.Background(), u))
	})
}

func testAdmissionAppliesDefaults(t *testing.T, s *suite) {
	ns := s.namespace(t)
	u := rawRelay(ns, "defaults", nil)
	require.NoError(t, s.c.Create(context.Background(), u))
	relay := &v1alpha1.OutboxRelay{}
	require.NoError(t, s.c.Get(context.Background(), client.ObjectKeyFromObject(u), relay))

	spec := relay.Spec
	require.Equal(t, v1alpha1.DefaultTable, spec.Postgres.Table)
	require.Equal(t, v1alpha1.OutboxColumns{
		ID: "id", EventType: "event_type", Payload: "payload", CreatedAt: "created_at", DispatchedAt: "dispatched_at",
	}, spec.Postgres.Columns)
	require.Equal(t, v1alpha1.DefaultStream, spec.Redis.Stream)
	require.Equal(t, v1alpha1.DefaultRelayBatchSize, spec.Relay.BatchSize)
	require.Equal(t, &metav1.Duration{Duration: v1alpha1.DefaultPollInterval}, spec.Relay.PollInterval)
	require.Equal(t, v1alpha1.DefaultLogLevel, spec.Relay.LogLevel)
	require.Equal(t, ptr.To(v1alpha1.DefaultMinReplicas), spec.Replicas.Min)
	require.Equal(t, v1alpha1.DefaultMaxReplicas, spec.Replicas.Max)
	require.Equal(t, v1alpha1.DefaultTargetBacklogPerRelay, spec.Replicas.TargetBacklogPerReplica)
	require.Equal(t, &metav1.Duration{Duration: v1alpha1.DefaultScaleDownWindow}, spec.Replicas.ScaleDownStabilizationWindow)
	require.Equal(t, v1alpha1.DefaultCleanupSchedule, spec.Cleanup.Schedule)
	require.Equal(t, &metav1.Duration{Duration: v1alpha1.DefaultRetention}, spec.Cleanup.Retention)
	require.Equal(t, v1alpha1.DefaultCleanupBatchSize, spec.Cleanup.BatchSize)
	require.Equal(t, &metav1.Duration{Duration: v1alpha1.DefaultBacklogCheckInterval}, spec.Backlog.CheckInterval)
	require.Equal(t, &metav1.Duration{Duration: 5 * time.Minute}, spec.Backlog.StalledAfter)
	require.False(t, spec.Suspend)
	require.Equal(t, v1alpha1.ReplicasModeOperator, spec.Replicas.Mode)
	require.Nil(t, spec.Replicas.Count)
	require.Equal(t, v1alpha1.SourcePolling, spec.Source)
	require.NotNil(t, spec.LogicalReplication.MaxRetainedWAL)
	require.Equal(t, v1alpha1.DefaultMaxRetainedWAL, spec.LogicalReplication.MaxRetainedWAL.Value())
	require.Equal(t, "1Gi", spec.LogicalReplication.MaxRetainedWAL.String())
	require.Empty(t, relay.Finalizers, "a Polling relay has no slot to drop")
}
