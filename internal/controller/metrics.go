package controller

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// RelayMetrics exports per-relay gauges, labelled namespace and name:
//
//	outbox_operator_relay_backlog                          undispatched rows at the last check
//	outbox_operator_relay_oldest_pending_age_seconds       age of the oldest undispatched row, at scrape time
//	outbox_operator_relay_dead_letters                     parked rows at the last check (not in the backlog)
//	outbox_operator_relay_desired_replicas                 replicas the operator asks for
//	outbox_operator_relay_ready_replicas                   ready relay pods
//	outbox_operator_relay_last_backlog_check_timestamp_seconds
//	outbox_operator_relay_ready                            1 when the Ready condition is True
//	outbox_operator_relay_stalled_after_seconds            spec.backlog.stalledAfter
//	outbox_operator_relay_condition{type,status,reason}    1 per condition, with its status and reason
//
// A relay's series disappear when it is deleted. The age is computed when
// Prometheus scrapes, so it grows between checks as the row waits.
type RelayMetrics struct {
	// Now is the clock of the age gauge (default time.Now).
	Now func() time.Time

	mu     sync.Mutex
	relays map[types.NamespacedName]relaySample

	backlog, age, deadLetters, desired, ready, lastCheck, isReady, stalledAfter, condition *prometheus.Desc
}

// relaySample is what the gauges of one relay report.
type relaySample struct {
	backlog     *int64
	oldest      *time.Time
	deadLetters *int64
	lastCheck   *time.Time
	desired     int32
	ready       int32
	isReady     bool
	// stalledAfter is kept across Set (SetStalledAfter); 0: not known.
	stalledAfter time.Duration
	conditions   []conditionSample
}

// conditionSample is one condition's type, status and reason.
type conditionSample struct{ typ, status, reason string }

var _ prometheus.Collector = (*RelayMetrics)(nil)

// NewRelayMetrics returns an empty RelayMetrics; register it with a
// Prometheus registry (controller-runtime's metrics.Registry).
func NewRelayMetrics() *RelayMetrics {
	labels := []string{"namespace", "name"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_operator_relay_"+name, help, labels, nil)
	}
	return &RelayMetrics{
		Now:         time.Now,
		relays:      map[types.NamespacedName]relaySample{},
		backlog:     desc("backlog", "Undispatched rows of the outbox table at the last backlog check."),
		age:         desc("oldest_pending_age_seconds", "Age of the oldest undispatched row, 0 when none is pending."),
		deadLetters: desc("dead_letters", "Rows parked in the dead-letter table at the last backlog check; not part of the backlog."),
		desired:     desc("desired_replicas", "Relays the operator asks the Deployment for."),
		ready:       desc("ready_replicas", "Ready relay pods."),
		lastCheck:   desc("last_backlog_check_timestamp_seconds", "Unix time of the last successful backlog check."),
		isReady:     desc("ready", "1 when the OutboxRelay's Ready condition is True, else 0."),
		stalledAfter: desc("stalled_after_seconds",
			"spec.backlog.stalledAfter: the age of the oldest pending row past which the backlog counts as stalled."),
		condition: prometheus.NewDesc("outbox_operator_relay_condition",
			"1 for each condition of the OutboxRelay's status, labelled with its type, status (True, False, Unknown) and reason.",
			slices.Concat(labels, []string{"type", "status", "reason"}), nil),
	}
}

// Set records a relay's status.
func (m *RelayMetrics) Set(key types.NamespacedName, s v1alpha1.OutboxRelayStatus) {
	sample := relaySample{
		backlog:     s.Backlog,
		deadLetters: s.DeadLetters,
		desired:     ptr.Deref(s.DesiredReplicas, 0),
		ready:       s.ReadyReplicas,
	}
	if s.OldestPendingTime != nil {
		sample.oldest = ptr.To(s.OldestPendingTime.Time)
	}
	if s.LastBacklogCheckTime != nil {
		sample.lastCheck = ptr.To(s.LastBacklogCheckTime.Time)
	}
	for _, c := range s.Conditions {
		if c.Type == string(v1alpha1.ConditionReady) {
			sample.isReady = c.Status == "True"
		}
		sample.conditions = append(sample.conditions, conditionSample{c.Type, string(c.Status), c.Reason})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sample.stalledAfter = m.relays[key].stalledAfter
	m.relays[key] = sample
}

// SetStalledAfter records a relay's spec.backlog.stalledAfter, which alerts
// compare the age of the oldest pending row with.
func (m *RelayMetrics) SetStalledAfter(key types.NamespacedName, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.relays[key]
	s.stalledAfter = d
	m.relays[key] = s
}

// Delete removes a relay's series.
func (m *RelayMetrics) Delete(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.relays, key)
}

// Describe implements prometheus.Collector.
func (m *RelayMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		m.backlog, m.age, m.deadLetters, m.desired, m.ready, m.lastCheck, m.isReady, m.stalledAfter, m.condition,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *RelayMetrics) Collect(ch chan<- prometheus.Metric) {
	now := m.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, s := range m.relays {
		l := []string{key.Namespace, key.Name}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		if s.backlog != nil {
			gauge(m.backlog, float64(*s.backlog))
			age := 0.0
			if s.oldest != nil {
				age = max(now.Sub(*s.oldest).Seconds(), 0)
			}
			gauge(m.age, age)
		}
		if s.deadLetters != nil {
			gauge(m.deadLetters, float64(*s.deadLetters))
		}
		if s.lastCheck != nil {
			gauge(m.lastCheck, float64(s.lastCheck.Unix()))
		}
		gauge(m.desired, float64(s.desired))
		gauge(m.ready, float64(s.ready))
		ready := 0.0
		if s.isReady {
			ready = 1
		}
		gauge(m.isReady, ready)
		if s.stalledAfter > 0 {
			gauge(m.stalledAfter, s.stalledAfter.Seconds())
		}
		for _, c := range s.conditions {
			ch <- prometheus.MustNewConstMetric(m.condition, prometheus.GaugeValue, 1, append(l[:2:2], c.typ, c.status, c.reason)...)
		}
	}
}
