package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodStarted(t *testing.T) {
	t.Parallel()
	pod := func(phase corev1.PodPhase, st corev1.ContainerState) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-backlog-x"},
			Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: "relay", State: st}}}}
	}
	creating := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	started, err := podStarted(pod(corev1.PodPending, creating))
	require.NoError(t, err)
	require.False(t, started)

	started, err = podStarted(pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}))
	require.NoError(t, err)
	require.True(t, started)

	started, err = podStarted(pod(corev1.PodFailed, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}))
	require.NoError(t, err)
	require.True(t, started, "an ended container has logs and an exit code to report")

	_, err = podStarted(pod(corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "CreateContainerConfigError", Message: `secret "orders-db" not found`}}))
	require.EqualError(t, err, `the relay pod orders-backlog-x could not start: CreateContainerConfigError: secret "orders-db" not found`)

	p := pod(corev1.PodFailed, corev1.ContainerState{})
	p.Status.Reason, p.Status.Message = "UnsupportedImage", "only the project's image runs"
	_, err = podStarted(p)
	require.ErrorContains(t, err, "failed before its container started: UnsupportedImage: only the project's image runs")
}
