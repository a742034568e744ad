package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

func TestStreamIntactCondition(t *testing.T) {
	t.Parallel()
	withResets := func(p *outbox.PendingResets) stateOption {
		return func(st *relayState) { st.backlog.Last.Backlog.StreamResets = p }
	}
	c := streamIntactCondition(newState())
	require.Equal(t, metav1.ConditionUnknown, c.status, "not checked yet")

	c = streamIntactCondition(newState(withResets(&outbox.PendingResets{})))
	require.Equal(t, metav1.ConditionTrue, c.status)
	require.Equal(t, v1alpha1.ReasonNoStreamReset, c.reason)

	from, to := statusNow.Add(-time.Hour), statusNow.Add(-time.Minute)
	c = streamIntactCondition(newState(withResets(&outbox.PendingResets{Count: 2, WindowStart: &from, WindowEnd: &to})))
	require.Equal(t, metav1.ConditionFalse, c.status)
	require.Equal(t, v1alpha1.ReasonStreamReset, c.reason)
	require.Contains(t, c.message, from.UTC().Format(time.RFC3339))
	require.Contains(t, c.message, "relay replay --stream=jobs --pending")

	onDispatch := newState(withResets(&outbox.PendingResets{Count: 1, WindowStart: &from, WindowEnd: &to}))
	onDispatch.relay.Spec.Cleanup.Mode = v1alpha1.CleanupOnDispatch
	c = streamIntactCondition(onDispatch)
	require.Equal(t, metav1.ConditionFalse, c.status)
	require.Contains(t, c.message, "no replay can republish them")
	require.Contains(t, c.message, "Rows dispatched before a switch to OnDispatch are still in the table: "+
		"`relay replay --stream=jobs --pending` republishes those", "a switch from AfterRetention left rows to replay")

	// LogicalReplication marks no row dispatched: the replay selects by created_at.
	replicated := newState(withResets(&outbox.PendingResets{Count: 1, WindowStart: &from, WindowEnd: &to}))
	replicated.relay.Spec.Source = v1alpha1.SourceLogicalReplication
	c = streamIntactCondition(replicated)
	require.Equal(t, metav1.ConditionFalse, c.status)
	require.Contains(t, c.message, "relay replay --stream=jobs --pending --source=LogicalReplication")
	require.Contains(t, c.message, "created before")

	c = streamIntactCondition(newState(failed(backlog.CauseUnreachable, "down")))
	require.Equal(t, metav1.ConditionUnknown, c.status)
}
