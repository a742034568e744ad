package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// TestWaitFlags: retry and replay wait for as many replicas as the relays.
func TestWaitFlags(t *testing.T) {
	r := relayRun{relay: &v1alpha1.OutboxRelay{}}
	require.Empty(t, waitFlags(r))
	r.relay.Spec.Redis.WaitReplicas = 2
	require.Equal(t, []string{"--wait-replicas=2"}, waitFlags(r))
	r.relay.Spec.Redis.WaitTimeout = &metav1.Duration{Duration: 1500 * time.Millisecond}
	require.Equal(t, []string{"--wait-replicas=2", "--wait-timeout=1.5s"}, waitFlags(r))
}

// TestReplayFlags: replay goes to the OutboxRelay's stream, and for source
// LogicalReplication, which marks no row dispatched, selects by created_at.
func TestReplayFlags(t *testing.T) {
	r := relayRun{relay: &v1alpha1.OutboxRelay{}}
	r.relay.Spec.Redis.Stream = "orders"
	require.Equal(t, []string{"--stream=orders"}, replayFlags(r))
	r.relay.Spec.Source = v1alpha1.SourceLogicalReplication
	r.relay.Spec.Redis.WaitReplicas = 1
	require.Equal(t, []string{"--stream=orders", "--wait-replicas=1", "--source=LogicalReplication"}, replayFlags(r))
	r.relay.Spec.Relay.BatchBytes = ptr.To(resource.MustParse("4Mi"))
	require.Equal(t, []string{"--stream=orders", "--wait-replicas=1", "--batch-bytes=4194304", "--source=LogicalReplication"},
		replayFlags(r))
}

// TestSlotFlags: for source LogicalReplication, whose rows are never marked
// dispatched, cleanup deletes behind the slot's progress and doctor checks
// the slot, with the slot the operator names (as the cleanup CronJob).
func TestSlotFlags(t *testing.T) {
	r := relayRun{relay: &v1alpha1.OutboxRelay{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}}
	require.Equal(t, []string{"--retention=72h0m0s", "--batch-size=1000"}, cleanupFlags(r))
	require.Empty(t, slotFlags(r))
	r.relay.Spec.Source = v1alpha1.SourceLogicalReplication
	slot := "--slot=" + controller.ReplicationSlotName(r.relay)
	require.Equal(t, []string{"--retention=72h0m0s", "--batch-size=1000", slot}, cleanupFlags(r))
	require.Contains(t, controller.CleanupCronJob(r.relay, "img").Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, slot,
		"the CronJob's slot")
}

// TestBudgetFlags: retry and replay read payloads within the relays' byte
// budget, which their pod's memory limit is sized from; none when unset.
func TestBudgetFlags(t *testing.T) {
	r := relayRun{relay: &v1alpha1.OutboxRelay{}}
	require.Empty(t, budgetFlags(r))
	r.relay.Spec.Relay.BatchBytes = ptr.To(resource.MustParse("8Mi"))
	require.Equal(t, []string{"--batch-bytes=8388608"}, budgetFlags(r))
}
