package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
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
}
