package podspec

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ShouldRestart reports whether a container that exited with exitCode is
// started again under the pod's restart policy.
func ShouldRestart(policy corev1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return true
	}
}

// Back-off between restarts of a container, as the kubelet's: 10s doubling to
// 5 minutes.
const (
	BackoffInitial = 10 * time.Second
	BackoffMax     = 5 * time.Minute
)

// Backoff is the wait before restart number restarts+1.
func Backoff(restarts int32) time.Duration {
	d := BackoffInitial
	for range restarts {
		d *= 2
		if d >= BackoffMax {
			return BackoffMax
		}
	}
	return d
}

// TerminatedReason is the kubelet's reason for an exit code.
func TerminatedReason(exitCode int32, oomKilled bool) string {
	switch {
	case oomKilled:
		return "OOMKilled"
	case exitCode == 0:
		return "Completed"
	default:
		return "Error"
	}
}

// Phase computes the pod's phase from its containers' statuses the way the
// kubelet's getPhase does.
func Phase(spec *corev1.PodSpec, initStatuses, statuses []corev1.ContainerStatus) corev1.PodPhase {
	for _, s := range initStatuses {
		switch {
		case s.State.Terminated != nil && s.State.Terminated.ExitCode == 0:
			continue
		case s.State.Terminated != nil && spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil &&
			s.LastTerminationState.Terminated.ExitCode != 0 && spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		default:
			return corev1.PodPending
		}
	}
	var running, waiting, stopped, succeeded int
	for _, s := range statuses {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated != nil {
				stopped++
			} else {
				waiting++
			}
		default:
			waiting++
		}
	}
	switch {
	case len(statuses) == 0 || waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case spec.RestartPolicy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case stopped == succeeded:
		return corev1.PodSucceeded
	case spec.RestartPolicy == corev1.RestartPolicyNever:
		return corev1.PodFailed
	default:
		return corev1.PodRunning
	}
}

// Conditions are the pod's conditions for its phase and containers, with
// transition times kept from prev where the status did not change.
func Conditions(
	phase corev1.PodPhase, sandboxReady bool, initStatuses, statuses []corev1.ContainerStatus, prev []corev1.PodCondition, now metav1.Time,
) []corev1.PodCondition {
	initialized := true
	for _, s := range initStatuses {
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			initialized = false
		}
	}
	ready := len(statuses) > 0
	for _, s := range statuses {
		if !s.Ready {
			ready = false
		}
	}
	var notReadyReason string
	if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
		ready, notReadyReason = false, "PodCompleted"
	} else if !ready {
		notReadyReason = "ContainersNotReady"
	}
	b := func(v bool) corev1.ConditionStatus {
		if v {
			return corev1.ConditionTrue
		}
		return corev1.ConditionFalse
	}
	reason := func(v bool, r string) string {
		if v {
			return ""
		}
		return r
	}
	conds := []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: b(sandboxReady)},
		{Type: corev1.PodInitialized, Status: b(initialized), Reason: reason(initialized, "ContainersNotInitialized")},
		{Type: corev1.ContainersReady, Status: b(ready), Reason: reason(ready, notReadyReason)},
		{Type: corev1.PodReady, Status: b(ready), Reason: reason(ready, notReadyReason)},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
	}
	for i := range conds {
		conds[i].LastTransitionTime = now
		for _, p := range prev {
			if p.Type == conds[i].Type && p.Status == conds[i].Status {
				conds[i].LastTransitionTime = p.LastTransitionTime
			}
		}
	}
	return conds
}
