package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// TestController runs the controller against a real kube-apiserver and etcd
// (envtest) and a real PostgreSQL (testenv). One API server and one manager
// serve every subtest; each subtest has its own namespace and database.
func TestController(t *testing.T) {
	s := startSuite(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *suite)
	}{
		{"AdmissionRejectsInvalidRelays", testAdmissionRejectsInvalidRelays},
		{"AdmissionAppliesDefaults", testAdmissionAppliesDefaults},
		{"ValidRelayGetsDeploymentAndCronJob", testValidRelayGetsDeploymentAndCronJob},
		{"PodTemplatePassesRestrictedPodSecurity", testPodTemplatePassesRestrictedPodSecurity},
		{"MissingSecretThenCreated", testMissingSecretThenCreated},
		{"MissingSecretKey", testMissingSecretKey},
		{"SecretOfAnotherNamespaceIsNotRead", testSecretOfAnotherNamespaceIsNotRead},
		{"WrongDSNIsDatabaseUnreachable", testWrongDSNIsDatabaseUnreachable},
		{"MissingTableIsOutboxTableNotFound", testMissingTableIsOutboxTableNotFound},
		{"BacklogScalesReplicasAndDrains", testBacklogScalesReplicasAndDrains},
		{"OldRowsAreBacklogStalled", testOldRowsAreBacklogStalled},
		{"ParkedRowsAreShownApartFromBacklog", testParkedRowsAreShownApartFromBacklog},
		{"RedisDurableCondition", testRedisDurableCondition}, // outboxrelay_redis_test.go
		{"SuspendScalesToZero", testSuspendScalesToZero},
		{"ExternalReplicasFollowScaleSubresource", testExternalReplicasFollowScaleSubresource}, // outboxrelay_scaling_test.go
		{"KEDASampleTargetsTheScaleSubresource", testKEDASampleTargetsTheScaleSubresource},
		{"LogicalReplicationExternalAtZeroRunsOne", testLogicalReplicationExternalAtZeroRunsOne},
		{"ReconcilePauseAnnotation", testReconcilePauseAnnotation},
		{"DeploymentDeletedOrEditedIsRestored", testDeploymentDeletedOrEditedIsRestored},
		{"CronJobDeletedOrEditedIsRestored", testCronJobDeletedOrEditedIsRestored},
		{"CleanupOnDispatchHasNoCronJob", testCleanupOnDispatchHasNoCronJob},
		{"TwoRelaysOnOneTableAreReported", testTwoRelaysOnOneTableAreReported},
		{"RelayOfAnotherStreamInTheDatabaseIsTableShared", testRelayOfAnotherStreamInTheDatabaseIsTableShared},
		{"LogicalReplicationRelay", testLogicalReplicationRelay},             // outboxrelay_replication_test.go
		{"UndroppableSlotKeepsFinalizer", testUndroppableSlotKeepsFinalizer}, // outboxrelay_replication_test.go
		{"SecretChangeRollsPodTemplate", testSecretChangeRollsPodTemplate},
		{"HangingDatabaseDoesNotHoldUpOthers", testHangingDatabaseDoesNotHoldUpOthers},
		{"FileReadingDSNKeyIsRefused", testFileReadingDSNKeyIsRefused},
		{"PrinterColumns", testPrinterColumns},
		{"CanaryPasswordNeverLeaks", testCanaryPasswordNeverLeaks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, s)
		})
	}
}

// readyRelay creates the Secrets and an OutboxRelay on a fresh database,
// and returns its key and a connection to the database.
func (s *suite) readyRelay(t *testing.T, opts ...relayOption) (types.NamespacedName, *pgx.Conn) {
	t.Helper()
	ns := s.namespace(t)
	dsn, conn := database(t)
	s.createSecrets(t, ns, "orders", dsn)
	relay := newRelay(ns, "orders", append([]relayOption{withFastChecks()}, opts...)...)
	s.createRelay(t, relay)
	return client.ObjectKeyFromObject(relay), conn
}

func testValidRelayGetsDeploymentAndCronJob(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t, withStream("orders.events"))
	relay := s.relay(t, key)

	dep := s.deployment(t, key)
	require.True(t, metav1.IsControlledBy(dep, relay), "the Deployment is owned by the OutboxRelay")
	require.Equal(t, ptr.To[int32](1), dep.Spec.Replicas)
	require.Equal(t, ManagedByOperator, dep.Labels[LabelManagedBy])
	require.NotEmpty(t, dep.Spec.Template.Annotations[AnnotationSecretHash])
	pod := dep.Spec.Template.Spec
	requireRestricted(t, pod)
	require.Equal(t, testImage, pod.Containers[0].Image)
	require.Equal(t, []string{"/relay", "run"}, pod.Containers[0].Command)
	require.Contains(t, pod.Containers[0].Args, "--stream=orders.events")
	require.Equal(t, "orders-db", pod.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name)

	cj := &batchv1.CronJob{}
	eventually(t, "the CronJob", func() error {
		return s.c.Get(context.Background(), types.NamespacedName{Namespace: key.Namespace, Name: "orders-cleanup"}, cj)
	})
	require.True(t, metav1.IsControlledBy(cj, relay), "the CronJob is owned by the OutboxRelay")
	require.Equal(t, "17 * * * *", cj.Spec.Schedule)
	require.Equal(t, batchv1.ForbidConcurrent, cj.Spec.ConcurrencyPolicy)
	require.Equal(t, []string{"/relay", "cleanup"}, cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Command)
	requireRestricted(t, cj.Spec.JobTemplate.Spec.Template.Spec)

	// The backlog is measured; the relays are not available until the
	// Deployment says so.
	relay = s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	require.Equal(t, ptr.To[int64](0), relay.Status.Backlog)
	relay = s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRelaysProgressing)
	require.Equal(t, "0/1", relay.Status.ReplicaSummary)

	s.markAvailable(t, key)
	relay = s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
	require.Equal(t, relay.Generation, relay.Status.ObservedGeneration)
	require.Equal(t, "1/1", relay.Status.ReplicaSummary)
	require.Equal(t, ptr.To[int32](1), relay.Status.DesiredReplicas)
	require.NotNil(t, relay.Status.LastBacklogCheckTime)
	for _, typ := range []v1alpha1.ConditionType{
		v1alpha1.ConditionSecretsResolved, v1alpha1.ConditionDatabaseReachable,
		v1alpha1.ConditionBacklogHealthy, v1alpha1.ConditionRelaysAvailable,
	} {
		c := findCondition(relay, typ)
		require.NotNil(t, c, typ)
		require.Equal(t, metav1.ConditionTrue, c.Status, "%s: %s", typ, c.Message)
	}
	s.waitEvent(t, key, v1alpha1.ReasonRelaysReady)
}

func testPodTemplatePassesRestrictedPodSecurity(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t)
	dep := s.deployment(t, key)

	// A namespace that enforces the restricted profile: the API server's
	// PodSecurity admission judges a pod made from the template.
	ns := s.namespace(t, "pod-security.kubernetes.io/enforce", "restricted", "pod-security.kubernetes.io/enforce-version", "latest")
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "relay"},
		Spec:       *dep.Spec.Template.Spec.DeepCopy(),
	}
	require.NoError(t, s.c.Create(ctx, pod), "the relay pod meets the restricted Pod Security Standard")

	cj := &batchv1.CronJob{}
	require.NoError(t, s.c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: "orders-cleanup"}, cj))
	cleanup := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cleanup"},
		Spec:       *cj.Spec.JobTemplate.Spec.Template.Spec.DeepCopy(),
	}
	require.NoError(t, s.c.Create(ctx, cleanup), "the cleanup pod meets the restricted Pod Security Standard")

	// The namespace does enforce: a pod that may escalate is refused.
	bad := pod.DeepCopy()
	bad.Name = "bad"
	bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	err := s.c.Create(ctx, bad)
	require.Error(t, err)
	require.Contains(t, err.Error(), "violates PodSecurity")
}

func testMissingSecretThenCreated(t *testing.T, s *suite) {
	ns := s.namespace(t)
	dsn, _ := database(t)
	s.createSecret(t, ns, "orders-redis", "url", testRedisURL)
	relay := newRelay(ns, "orders", withFastChecks())
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)

	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	c := findCondition(got, v1alpha1.ConditionSecretsResolved)
	require.Equal(t, string(v1alpha1.ReasonSecretNotFound), c.Reason)
	require.Contains(t, c.Message, `Secret "orders-db"`)
	require.Contains(t, c.Message, "spec.postgres.dsnSecretRef")
	s.waitEvent(t, key, v1alpha1.ReasonSecretNotFound)
	// Nothing is deployed that would crash-loop on a missing Secret.
	err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "orders-relay"}, &appsv1.Deployment{})
	require.True(t, apierrors.IsNotFound(err), "no Deployment without its Secrets: %v", err)

	s.createSecret(t, ns, "orders-db", "dsn", dsn)
	s.waitCondition(t, key, v1alpha1.ConditionSecretsResolved, metav1.ConditionTrue, v1alpha1.ReasonSecretsResolved)
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	s.markAvailable(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
}

func testMissingSecretKey(t *testing.T, s *suite) {
	ns := s.namespace(t)
	dsn, _ := database(t)
	s.createSecret(t, ns, "orders-db", "wrong-key", dsn)
	s.createSecret(t, ns, "orders-redis", "url", testRedisURL)
	relay := newRelay(ns, "orders", withFastChecks())
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)

	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretKeyMissing)
	require.Contains(t, findCondition(got, v1alpha1.ConditionReady).Message, `has no key "dsn"`)

	s.createSecret(t, ns, "orders-db", "dsn", dsn)
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
}

func testSecretOfAnotherNamespaceIsNotRead(t *testing.T, s *suite) {
	dsn, _ := database(t)
	other := s.namespace(t)
	s.createSecrets(t, other, "orders", dsn)

	ns := s.namespace(t)
	relay := newRelay(ns, "orders")
	s.createRelay(t, relay)
	got := s.waitCondition(t, client.ObjectKeyFromObject(relay), v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	require.Contains(t, findCondition(got, v1alpha1.ConditionReady).Message, fmt.Sprintf("namespace %q", ns))
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

func testWrongDSNIsDatabaseUnreachable(t *testing.T, s *suite) {
	ns := s.namespace(t)
	s.createSecrets(t, ns, "orders", fmt.Sprintf("postgres://app@127.0.0.1:%d/app?sslmode=disable", closedPort(t)))
	relay := newRelay(ns, "orders", withFastChecks())
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)

	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)
	c := findCondition(got, v1alpha1.ConditionDatabaseReachable)
	require.Equal(t, string(v1alpha1.ReasonDatabaseUnreachable), c.Reason)
	require.Contains(t, c.Message, "PostgreSQL is unreachable from the operator")
	require.NotContains(t, c.Message, "refused", "no error class: it would map the network")
	require.NotContains(t, c.Message, "127.0.0.1")
	require.Nil(t, got.Status.Backlog, "nothing was measured")
	// The relays are deployed anyway: the database may come up.
	s.deployment(t, key)
	s.waitEvent(t, key, v1alpha1.ReasonDatabaseUnreachable)

	// Pointing the Secret at a real database recovers.
	dsn, _ := database(t)
	s.createSecret(t, ns, "orders-db", "dsn", dsn)
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
}

func testMissingTableIsOutboxTableNotFound(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t, withTable("app.missing_events"))
	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonOutboxTableNotFound)
	c := findCondition(got, v1alpha1.ConditionDatabaseReachable)
	require.Contains(t, c.Message, "app.missing_events")
}

func testBacklogScalesReplicasAndDrains(t *testing.T, s *suite) {
	key, conn := s.readyRelay(t, withReplicas(1, 5, 1000, "1h"))
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	ctx := context.Background()

	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 'order.created', '{}' FROM generate_series(1, 2500)`)
	require.NoError(t, err)
	relay := s.waitStatus(t, key, "backlog 2500 and 3 desired relays", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, -1) != 2500 || ptr.Deref(st.DesiredReplicas, -1) != 3 {
			return fmt.Errorf("backlog %v, desired %v", ptr.Deref(st.Backlog, -1), ptr.Deref(st.DesiredReplicas, -1))
		}
		return nil
	})
	require.NotNil(t, relay.Status.OldestPendingTime)
	s.waitDeployment(t, key, "3 replicas", func(d *appsv1.Deployment) error {
		if ptr.Deref(d.Spec.Replicas, 0) != 3 {
			return fmt.Errorf("replicas %d", ptr.Deref(d.Spec.Replicas, 0))
		}
		return nil
	})
	s.waitEvent(t, key, v1alpha1.ReasonScaled)
	requireGauge(t, s, "outbox_operator_relay_backlog", key, 2500)

	// Drained: the window holds the relays at 3...
	_, err = conn.Exec(ctx, `UPDATE outbox_events SET dispatched_at = now()`)
	require.NoError(t, err)
	relay = s.waitStatus(t, key, "backlog 0 with a pending scale-down", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, -1) != 0 || st.ScaleDownPendingSince == nil {
			return fmt.Errorf("backlog %v, scaleDownPendingSince %v", ptr.Deref(st.Backlog, -1), st.ScaleDownPendingSince)
		}
		return nil
	})
	require.Equal(t, ptr.To[int32](3), relay.Status.DesiredReplicas, "scale-down waits for the window")
	require.Nil(t, relay.Status.OldestPendingTime)

	// ...and once the window is shorter than the wait, they scale down.
	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) {
		r.Spec.Replicas.ScaleDownStabilizationWindow = &metav1.Duration{Duration: 0}
	})
	s.waitStatus(t, key, "1 desired relay after the drain", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.DesiredReplicas, -1) != 1 || st.ScaleDownPendingSince != nil {
			return fmt.Errorf("desired %v, pending since %v", ptr.Deref(st.DesiredReplicas, -1), st.ScaleDownPendingSince)
		}
		return nil
	})
	s.waitDeployment(t, key, "1 replica", func(d *appsv1.Deployment) error {
		if ptr.Deref(d.Spec.Replicas, 0) != 1 {
			return fmt.Errorf("replicas %d", ptr.Deref(d.Spec.Replicas, 0))
		}
		return nil
	})
	requireGauge(t, s, "outbox_operator_relay_backlog", key, 0)
}

func testOldRowsAreBacklogStalled(t *testing.T, s *suite) {
	key, conn := s.readyRelay(t)
	_, err := conn.Exec(context.Background(),
		`INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('order.created', '{}', now() - interval '1 hour')`)
	require.NoError(t, err)
	s.markAvailable(t, key)
	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonBacklogStalled)
	require.Contains(t, findCondition(got, v1alpha1.ConditionBacklogHealthy).Message, "backlog.stalledAfter (5m0s)")
	require.NotNil(t, got.Status.OldestPendingTime)
	require.Greater(t, time.Since(got.Status.OldestPendingTime.Time), 59*time.Minute)
	age := gauge(t, s, "outbox_operator_relay_oldest_pending_age_seconds", key)
	require.Greater(t, age, 3540.0)
}

// park puts n rows into the dead-letter table of the default outbox table,
// as the relay does with rows it cannot publish.
func park(t *testing.T, conn *pgx.Conn, n int) {
	t.Helper()
	ctx := context.Background()
	table := outbox.MustNew("", outbox.Columns{})
	_, err := conn.Exec(ctx, table.DeadLetterDDL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO `+pgx.Identifier{table.DeadLetterTableName()}.Sanitize()+`
		(event_id, event_type, payload, created_at, stream, reason)
		SELECT g::text, 'order.created', NULL, now(), 'jobs', 'payload is NULL' FROM generate_series(1, $1::int) g`, n)
	require.NoError(t, err)
}

func testParkedRowsAreShownApartFromBacklog(t *testing.T, s *suite) {
	key, conn := s.readyRelay(t)
	ctx := context.Background()
	s.markAvailable(t, key)
	relay := s.waitCondition(t, key, v1alpha1.ConditionDeadLettersClear, metav1.ConditionTrue, v1alpha1.ReasonNoDeadLetters)
	require.Equal(t, ptr.To[int64](0), relay.Status.DeadLetters)
	requireGauge(t, s, "outbox_operator_relay_dead_letters", key, 0)

	park(t, conn, 3)
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('order.created', '{}')`)
	require.NoError(t, err)
	relay = s.waitStatus(t, key, "3 dead letters and a backlog of 1", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.DeadLetters, -1) != 3 || ptr.Deref(st.Backlog, -1) != 1 {
			return fmt.Errorf("deadLetters %v, backlog %v", ptr.Deref(st.DeadLetters, -1), ptr.Deref(st.Backlog, -1))
		}
		return nil
	})
	c := findCondition(relay, v1alpha1.ConditionDeadLettersClear)
	require.NotNil(t, c)
	require.Equal(t, metav1.ConditionFalse, c.Status)
	require.Equal(t, string(v1alpha1.ReasonDeadLettersPresent), c.Reason)
	require.Contains(t, c.Message, "3 rows are parked in table outbox_events_dead_letters")
	require.Contains(t, c.Message, "`relay dead-letters list`")
	ready := findCondition(relay, v1alpha1.ConditionReady)
	require.Equal(t, string(v1alpha1.ReasonRelaysReady), ready.Reason, "parked rows do not make the relay unready: %s", ready.Message)
	ev := s.waitEvent(t, key, v1alpha1.ReasonDeadLettersPresent)
	require.Equal(t, corev1.EventTypeWarning, ev.Type)
	require.Equal(t, c.Message, ev.Note)
	requireGauge(t, s, "outbox_operator_relay_dead_letters", key, 3)
	requireGauge(t, s, "outbox_operator_relay_backlog", key, 1)

	// A person retried or discarded them: the condition clears, with a
	// Normal Event.
	_, err = conn.Exec(ctx, `DELETE FROM outbox_events_dead_letters`)
	require.NoError(t, err)
	s.waitCondition(t, key, v1alpha1.ConditionDeadLettersClear, metav1.ConditionTrue, v1alpha1.ReasonNoDeadLetters)
	require.Equal(t, corev1.EventTypeNormal, s.waitEvent(t, key, v1alpha1.ReasonNoDeadLetters).Type)
	requireGauge(t, s, "outbox_operator_relay_dead_letters", key, 0)

	// Deleting the relay removes its series.
	require.NoError(t, s.c.Delete(ctx, s.relay(t, key)))
	eventually(t, "no dead-letter gauge for the deleted relay", func() error {
		if v, err := gaugeValue(s, "outbox_operator_relay_dead_letters", key); err == nil {
			return fmt.Errorf("still reported: %v", v)
		}
		return nil
	})
}

func testSuspendScalesToZero(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t, withSuspend())
	s.waitDeployment(t, key, "0 replicas", func(d *appsv1.Deployment) error {
		if ptr.Deref(d.Spec.Replicas, -1) != 0 {
			return fmt.Errorf("replicas %d", ptr.Deref(d.Spec.Replicas, -1))
		}
		return nil
	})
	got := s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSuspended)
	require.Equal(t, ptr.To[int32](0), got.Status.DesiredReplicas)
	require.Equal(t, string(v1alpha1.ReasonSuspended), findCondition(got, v1alpha1.ConditionRelaysAvailable).Reason)
	// The backlog is still measured while suspended.
	s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)

	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) { r.Spec.Suspend = false })
	s.waitDeployment(t, key, "1 replica after resuming", func(d *appsv1.Deployment) error {
		if ptr.Deref(d.Spec.Replicas, -1) != 1 {
			return fmt.Errorf("replicas %d", ptr.Deref(d.Spec.Replicas, -1))
		}
		return nil
	})
	s.markAvailable(t, key)
	s.waitCondition(t, key, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRelaysReady)
}

func testDeploymentDeletedOrEditedIsRestored(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t)
	ctx := context.Background()
	dep := s.deployment(t, key)
	want := dep.Spec.Template.Spec.Containers[0]

	require.NoError(t, s.c.Delete(ctx, dep))
	restored := s.waitDeployment(t, key, "a new Deployment", func(d *appsv1.Deployment) error {
		if d.UID == dep.UID {
			return fmt.Errorf("still the deleted one")
		}
		return nil
	})

	edit := func(change func(*appsv1.Deployment)) {
		t.Helper()
		d := &appsv1.Deployment{}
		require.NoError(t, s.c.Get(ctx, client.ObjectKeyFromObject(restored), d))
		change(d)
		require.NoError(t, s.c.Update(ctx, d))
	}
	edit(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Image = "example.test/evil:latest"
		d.Spec.Template.Spec.Containers[0].Args = []string{"--table=other"}
		d.Spec.Replicas = ptr.To[int32](7)
	})
	s.waitDeployment(t, key, "the edit put back", func(d *appsv1.Deployment) error {
		c := d.Spec.Template.Spec.Containers[0]
		if c.Image != want.Image || strings.Join(c.Args, " ") != strings.Join(want.Args, " ") || ptr.Deref(d.Spec.Replicas, 0) != 1 {
			return fmt.Errorf("image %s, args %v, replicas %d", c.Image, c.Args, ptr.Deref(d.Spec.Replicas, 0))
		}
		return nil
	})

	// Removing the label the cache selects on hides the Deployment from the
	// cache; the controller still finds it and puts the label back.
	edit(func(d *appsv1.Deployment) { delete(d.Labels, LabelManagedBy) })
	s.updateRelay(t, key, func(r *v1alpha1.OutboxRelay) { r.Spec.Relay.BatchSize = 100 })
	s.waitDeployment(t, key, "the label put back and the new batch size", func(d *appsv1.Deployment) error {
		if d.Labels[LabelManagedBy] != ManagedByOperator {
			return fmt.Errorf("labels %v", d.Labels)
		}
		if !strings.Contains(strings.Join(d.Spec.Template.Spec.Containers[0].Args, " "), "--batch-size=100") {
			return fmt.Errorf("args %v", d.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})
}

func testCronJobDeletedOrEditedIsRestored(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t)
	ctx := context.Background()
	name := types.NamespacedName{Namespace: key.Namespace, Name: "orders-cleanup"}
	cj := &batchv1.CronJob{}
	eventually(t, "the CronJob", func() error { return s.c.Get(ctx, name, cj) })

	cj.Spec.Schedule = "0 0 1 1 *"
	cj.Spec.ConcurrencyPolicy = batchv1.AllowConcurrent
	require.NoError(t, s.c.Update(ctx, cj))
	eventually(t, "the CronJob edit put back", func() error {
		got := &batchv1.CronJob{}
		if err := s.c.Get(ctx, name, got); err != nil {
			return err
		}
		if got.Spec.Schedule != "17 * * * *" || got.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
			return fmt.Errorf("schedule %q, policy %s", got.Spec.Schedule, got.Spec.ConcurrencyPolicy)
		}
		return nil
	})

	require.NoError(t, s.c.Delete(ctx, cj))
	eventually(t, "a new CronJob", func() error {
		got := &batchv1.CronJob{}
		if err := s.c.Get(ctx, name, got); err != nil {
			return err
		}
		if got.UID == cj.UID {
			return fmt.Errorf("still the deleted one")
		}
		return nil
	})
}

// testCleanupOnDispatchHasNoCronJob: switched to cleanup mode OnDispatch,
// the relays are told to delete what they publish and the CronJob goes;
// switched back, it returns.
func testCleanupOnDispatchHasNoCronJob(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t)
	ctx := context.Background()
	name := types.NamespacedName{Namespace: key.Namespace, Name: "orders-cleanup"}
	eventually(t, "the CronJob of the default mode", func() error { return s.c.Get(ctx, name, &batchv1.CronJob{}) })
	require.NotContains(t, s.deployment(t, key).Spec.Template.Spec.Containers[0].Args, "--cleanup-mode=OnDispatch")

	setMode := func(mode v1alpha1.CleanupMode) {
		eventually(t, "cleanup.mode "+string(mode)+" written", func() error {
			relay := s.relay(t, key)
			relay.Spec.Cleanup.Mode = mode
			return s.c.Update(ctx, relay)
		})
	}
	setMode(v1alpha1.CleanupOnDispatch)
	eventually(t, "the relays told to delete on dispatch", func() error {
		if args := s.deployment(t, key).Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--cleanup-mode=OnDispatch") {
			return fmt.Errorf("args %v", args)
		}
		return nil
	})
	eventually(t, "the CronJob deleted", func() error {
		err := s.c.Get(ctx, name, &batchv1.CronJob{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (get: %v)", err)
	})
	relay := s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	require.Nil(t, relay.Status.LastCleanupTime)

	setMode(v1alpha1.CleanupAfterRetention)
	eventually(t, "the CronJob back", func() error { return s.c.Get(ctx, name, &batchv1.CronJob{}) })
}

func testSecretChangeRollsPodTemplate(t *testing.T, s *suite) {
	key, _ := s.readyRelay(t)
	before := s.deployment(t, key).Spec.Template.Annotations[AnnotationSecretHash]
	require.NotEmpty(t, before)

	s.createSecret(t, key.Namespace, "orders-redis", "url", "redis://127.0.0.1:6380/1")
	s.waitDeployment(t, key, "a new secret hash in the pod template", func(d *appsv1.Deployment) error {
		if h := d.Spec.Template.Annotations[AnnotationSecretHash]; h == before || h == "" {
			return fmt.Errorf("hash still %q", h)
		}
		return nil
	})
}

// blackhole listens on loopback and accepts connections without ever
// answering: a database that hangs.
func blackhole(t *testing.T) int {
	t.Helper()
	return new(blackholes).listen(t)
}

// blackholes counts the connections open to a set of blackhole listeners.
type blackholes struct {
	open, peak atomic.Int64
}

// listen starts one more blackhole and returns its port; it reads what a
// client sends, never answers, and notices when the client hangs up. It
// stops in cleanup.
func (g *blackholes) listen(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			storeMax(&g.peak, g.open.Add(1))
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c) // until the client (or cleanup) closes it
				g.open.Add(-1)
			})
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().(*net.TCPAddr).Port
}

// storeMax raises a to v when v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for old := a.Load(); v > old; old = a.Load() {
		if a.CompareAndSwap(old, v) {
			return
		}
	}
}

func testHangingDatabaseDoesNotHoldUpOthers(t *testing.T, s *suite) {
	ns := s.namespace(t)
	hung := newRelay(ns, "hung", withFastChecks())
	s.createSecrets(t, ns, "hung", fmt.Sprintf("postgres://app@127.0.0.1:%d/app?sslmode=disable&connect_timeout=60", blackhole(t)))
	s.createRelay(t, hung)
	hungKey := client.ObjectKeyFromObject(hung)
	s.waitCondition(t, hungKey, v1alpha1.ConditionDatabaseReachable, metav1.ConditionUnknown, v1alpha1.ReasonBacklogCheckPending)

	// While the first relay's check hangs, another relay is reconciled and
	// measured at once.
	dsn, _ := database(t)
	fine := newRelay(ns, "fine", withFastChecks())
	s.createSecrets(t, ns, "fine", dsn)
	s.createRelay(t, fine)
	s.waitCondition(t, client.ObjectKeyFromObject(fine),
		v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, v1alpha1.ReasonBacklogMeasured)
	c := findCondition(s.relay(t, hungKey), v1alpha1.ConditionDatabaseReachable)
	require.Equal(t, string(v1alpha1.ReasonBacklogCheckPending), c.Reason,
		"the healthy relay was measured while the hanging relay's check still ran")
	s.deployment(t, hungKey) // the hanging relay's children were written meanwhile

	got := s.waitCondition(t, hungKey, v1alpha1.ConditionDatabaseReachable, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)
	require.Contains(t, findCondition(got, v1alpha1.ConditionDatabaseReachable).Message,
		"PostgreSQL is unreachable from the operator", "a blackhole reads like a refusal")
}

func testFileReadingDSNKeyIsRefused(t *testing.T, s *suite) {
	ns := s.namespace(t)
	dsn, _ := database(t)
	s.createSecrets(t, ns, "files", dsn+"&sslrootcert=/etc/hostname")
	relay := newRelay(ns, "files", withFastChecks(), withReplicas(0, 2, 1000, "0s"))
	s.createRelay(t, relay)
	key := client.ObjectKeyFromObject(relay)

	got := s.waitCondition(t, key, v1alpha1.ConditionDatabaseReachable, metav1.ConditionFalse, v1alpha1.ReasonDSNKeyNotAllowed)
	require.Contains(t, findCondition(got, v1alpha1.ConditionDatabaseReachable).Message, "the DSN sets sslrootcert;")
	require.Equal(t, string(metav1.ConditionTrue), string(findCondition(got, v1alpha1.ConditionSecretsResolved).Status),
		"the relays may honour the key in their own pods")
	// The backlog is unknown: min 0 still runs one relay.
	dep := s.deployment(t, key)
	require.Equal(t, int32(1), *dep.Spec.Replicas)
}

func testPrinterColumns(t *testing.T, s *suite) {
	key, conn := s.readyRelay(t, withStream("orders.events"))
	_, err := conn.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 42)`)
	require.NoError(t, err)
	park(t, conn, 2)
	s.markAvailable(t, key)
	s.waitStatus(t, key, "backlog 42, 2 dead letters and 1/1 relays", func(st *v1alpha1.OutboxRelayStatus) error {
		if ptr.Deref(st.Backlog, -1) != 42 || ptr.Deref(st.DeadLetters, -1) != 2 || st.ReplicaSummary != "1/1" {
			return fmt.Errorf("backlog %v, deadLetters %v, replicas %s", ptr.Deref(st.Backlog, -1), ptr.Deref(st.DeadLetters, -1), st.ReplicaSummary)
		}
		return nil
	})

	// What `kubectl get outboxrelays` asks for: a server-side Table.
	httpClient, err := rest.HTTPClientFor(s.cfg)
	require.NoError(t, err)
	url := fmt.Sprintf("%s/apis/relay.outbox.dev/v1alpha1/namespaces/%s/outboxrelays", strings.TrimSuffix(s.cfg.Host, "/"), key.Namespace)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var table metav1.Table
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&table))

	names := make([]string, 0, len(table.ColumnDefinitions))
	for _, c := range table.ColumnDefinitions {
		names = append(names, c.Name)
	}
	require.Equal(t, []string{
		"Name", "Stream", "Backlog", "Oldest", "Dead-Letters", "Replicas", "Ready", "Reason", "Ordering", "Scaling", "Slot", "Age",
	}, names)
	require.Equal(t, int32(1), table.ColumnDefinitions[4].Priority, "Dead-Letters shows with -o wide only")
	require.Len(t, table.Rows, 1)
	cells := table.Rows[0].Cells
	require.Equal(t, "orders", cells[0])
	require.Equal(t, "orders.events", cells[1])
	require.EqualValues(t, 42, cells[2])
	require.NotEmpty(t, cells[3], "the oldest pending row's time, shown as an age")
	require.EqualValues(t, 2, cells[4])
	require.Equal(t, "1/1", cells[5])
	require.Contains(t, []any{"True", "False"}, cells[6])
}

func testCanaryPasswordNeverLeaks(t *testing.T, s *suite) {
	const canary = "Canary-7f3a9c-Pa55word"
	ns := s.namespace(t)
	ctx := context.Background()

	// One relay with a DSN that cannot connect, one with a DSN that cannot
	// be parsed (parse errors of net/url quote the whole URL), one with a
	// Redis URL that is wrong; every value holds the canary.
	s.createSecret(t, ns, "unreachable-db", "dsn", fmt.Sprintf("postgres://alice:%s@127.0.0.1:%d/app?sslmode=disable", canary, closedPort(t)))
	s.createSecret(t, ns, "unreachable-redis", "url", "redis://:"+canary+"@127.0.0.1:6379/0")
	s.createSecret(t, ns, "unparsable-db", "dsn", "postgres://alice:"+canary+"@127.0.0.1:notaport/app")
	s.createSecret(t, ns, "unparsable-redis", "url", "redis://:"+canary+"@127.0.0.1:6379/0")
	s.createSecret(t, ns, "badredis-db", "dsn", fmt.Sprintf("postgres://alice:%s@127.0.0.1:%d/app", canary, closedPort(t)))
	s.createSecret(t, ns, "badredis-redis", "url", "http://:"+canary+"@127.0.0.1:6379/0")
	// As `kubectl apply` leaves it: the whole Secret in an annotation.
	s.createSecret(t, ns, "applied-db", "dsn", "postgres://alice:"+canary+"@127.0.0.1/app")
	applied := &corev1.Secret{}
	require.NoError(t, s.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "applied-db"}, applied))
	applied.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"stringData":{"dsn":"` + canary + `"}}`}
	require.NoError(t, s.c.Update(ctx, applied))
	s.createSecret(t, ns, "applied-redis", "url", testRedisURL)
	for _, name := range []string{"unreachable", "unparsable", "badredis", "applied"} {
		s.createRelay(t, newRelay(ns, name, withFastChecks()))
	}
	s.waitCondition(t, types.NamespacedName{Namespace: ns, Name: "unreachable"},
		v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)
	s.waitCondition(t, types.NamespacedName{Namespace: ns, Name: "unparsable"},
		v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDSNInvalid)
	s.waitCondition(t, types.NamespacedName{Namespace: ns, Name: "badredis"},
		v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRedisURLInvalid)
	s.waitEvent(t, types.NamespacedName{Namespace: ns, Name: "unreachable"}, v1alpha1.ReasonDatabaseUnreachable)
	s.waitEvent(t, types.NamespacedName{Namespace: ns, Name: "unparsable"}, v1alpha1.ReasonDSNInvalid)

	h := haystack{}
	counts := h.addNamespace(t, s.c, ns)
	require.NotZero(t, counts["Deployments"], "the unreachable relay has its Deployment")
	require.NotZero(t, counts["Events"])
	h["manager logs"] = s.logs.String()
	metrics, err := s.metrics.Gather()
	require.NoError(t, err)
	h.add(t, "metrics", metrics)

	// The manager's cache of Secret metadata holds no annotation.
	secretMeta := &metav1.PartialObjectMetadata{}
	secretMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	eventually(t, "the Secret's metadata in the manager's cache", func() error {
		return s.cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: "applied-db"}, secretMeta)
	})
	require.Equal(t, applied.ResourceVersion, secretMeta.ResourceVersion)
	h.add(t, "cached Secret metadata", secretMeta)

	require.Empty(t, h.find(canary), "the canary password leaked")
	// The logs did record these relays, so the search was not in vain.
	require.Contains(t, s.logs.String(), ns)
}

// haystack is what a password must never show up in, by where it came from.
type haystack map[string]string

// add puts obj in, as JSON.
func (h haystack) add(t testing.TB, what string, obj any) {
	t.Helper()
	raw, err := json.Marshal(obj)
	require.NoError(t, err)
	h[what] = string(raw)
}

// addNamespace puts in the OutboxRelays (spec and status), Deployments,
// CronJobs and Events of a namespace, and returns how many of each it found.
func (h haystack) addNamespace(t testing.TB, c client.Reader, ns string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for what, list := range map[string]client.ObjectList{
		"OutboxRelays": &v1alpha1.OutboxRelayList{},
		"Deployments":  &appsv1.DeploymentList{},
		"CronJobs":     &batchv1.CronJobList{},
		"Events":       &eventsv1.EventList{},
		"core Events":  &corev1.EventList{},
	} {
		require.NoError(t, c.List(context.Background(), list, client.InNamespace(ns)))
		counts[what] = meta.LenList(list)
		h.add(t, what, list)
	}
	return counts
}

// find returns, by place, up to 80 characters from each first occurrence
// of needle; empty when there is none.
func (h haystack) find(needle string) map[string]string {
	found := map[string]string{}
	for what, text := range h {
		if i := strings.Index(text, needle); i >= 0 {
			found[what] = text[i:min(len(text), i+80)]
		}
	}
	return found
}

// findCondition returns the relay's condition of a type, or nil.
func findCondition(relay *v1alpha1.OutboxRelay, typ v1alpha1.ConditionType) *metav1.Condition {
	for i := range relay.Status.Conditions {
		if relay.Status.Conditions[i].Type == string(typ) {
			return &relay.Status.Conditions[i]
		}
	}
	return nil
}

// waitEvent waits for an Event about the relay with the reason, and returns
// it.
func (s *suite) waitEvent(t *testing.T, key types.NamespacedName, reason v1alpha1.Reason) *eventsv1.Event {
	t.Helper()
	var found *eventsv1.Event
	eventually(t, fmt.Sprintf("an Event %s about %s", reason, key), func() error {
		var events eventsv1.EventList
		if err := s.c.List(context.Background(), &events, client.InNamespace(key.Namespace)); err != nil {
			return err
		}
		var seen []string
		for _, e := range events.Items {
			if e.Regarding.Name == key.Name && e.Regarding.Kind == "OutboxRelay" {
				if e.Reason == string(reason) {
					found = &e
					return nil
				}
				seen = append(seen, e.Reason)
			}
		}
		return fmt.Errorf("events so far: %v", seen)
	})
	return found
}

// gaugeValue returns the value of a relay's gauge, or an error when it has
// none.
func gaugeValue(s *suite, name string, key types.NamespacedName) (float64, error) {
	families, err := s.metrics.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == key.Namespace && labels["name"] == key.Name {
				return m.GetGauge().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no %s for %s", name, key)
}

// gauge returns the value of a relay's gauge.
func gauge(t *testing.T, s *suite, name string, key types.NamespacedName) float64 {
	t.Helper()
	v, err := gaugeValue(s, name, key)
	require.NoError(t, err)
	return v
}

// requireGauge waits until a relay's gauge has the value.
func requireGauge(t *testing.T, s *suite, name string, key types.NamespacedName, want float64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s = %v", name, want), func() error {
		got, err := gaugeValue(s, name, key)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s is %v", name, got)
		}
		return nil
	})
}
