package controller

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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
//	outbox_operator_relay_replication_slot_retained_bytes  WAL the replication slot keeps (source LogicalReplication)
//
// A relay's series disappear when it is deleted. The age is computed when
// Prometheus scrapes, so it grows between checks as the row waits.
type RelayMetrics struct {
	// Now is the clock of the age gauge (default time.Now).
	Now func() time.Time

	mu     sync.Mutex
	relays map[types.NamespacedName]relaySample
	// pairs holds one label pair per condition label and value (type,
	// status, reason: a few dozen), shared by every relay's series.
	pairs map[[2]string]*dto.LabelPair

	backlog, age, deadLetters, desired, ready, lastCheck, isReady, stalledAfter, condition *prometheus.Desc
	slotRetained                                                                           *prometheus.Desc
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
	// slotRetained is the WAL the relay's replication slot keeps; nil
	// without a slot, or before it exists.
	slotRetained *int64
	// stalledAfter is kept across Set (SetStalledAfter); 0: not known.
	stalledAfter time.Duration
	// labels are the relay's label pairs (name, namespace); conditions
	// holds those of each condition's series (the relay's, then reason,
	// status and type). Both are made when the status is recorded, not at
	// each scrape.
	labels     []*dto.LabelPair
	conditions [][]*dto.LabelPair
}

// relayGauge is one sample of a relay's series. Its label pairs are made
// once, when the relay's status is recorded: prometheus.MustNewConstMetric
// makes them at every scrape, some fifteen thousand sets (megabytes of
// garbage) for a thousand relays. A collected metric's labels are immutable
// by the registry's contract, so the series share them.
type relayGauge struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
}

var _ prometheus.Metric = relayGauge{}

// Desc implements prometheus.Metric.
func (g relayGauge) Desc() *prometheus.Desc { return g.desc }

// Write implements prometheus.Metric.
func (g relayGauge) Write(out *dto.Metric) error {
	out.Label = g.labels
	out.Gauge = &dto.Gauge{Value: &g.value}
	return nil
}

// labelPair makes a label pair.
func labelPair(name, value string) *dto.LabelPair { return &dto.LabelPair{Name: &name, Value: &value} }

// pairLocked returns the shared label pair of a condition label's value.
func (m *RelayMetrics) pairLocked(name, value string) *dto.LabelPair {
	k := [2]string{name, value}
	p, ok := m.pairs[k]
	if !ok {
		p = labelPair(name, value)
		m.pairs[k] = p
	}
	return p
}

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
		pairs:       map[[2]string]*dto.LabelPair{},
		backlog:     desc("backlog", "Undispatched rows of the outbox table at the last backlog check."),
		age:         desc("oldest_pending_age_seconds", "Age of the oldest undispatched row, 0 when none is pending."),
		deadLetters: desc("dead_letters", "Rows parked in the dead-letter table at the last backlog check; not part of the backlog."),
		desired:     desc("desired_replicas", "Relays the operator asks the Deployment for."),
		ready:       desc("ready_replicas", "Ready relay pods."),
		lastCheck:   desc("last_backlog_check_timestamp_seconds", "Unix time of the last successful backlog check."),
		isReady:     desc("ready", "1 when the OutboxRelay's Ready condition is True, else 0."),
		stalledAfter: desc("stalled_after_seconds",
			"spec.backlog.stalledAfter: the age of the oldest pending row past which the backlog counts as stalled."),
		slotRetained: desc("replication_slot_retained_bytes",
			"WAL bytes the replication slot of a relay of source LogicalReplication makes the server keep, at the last backlog check."),
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
	if rs := s.Replication; rs != nil && rs.RetainedBytes != nil {
		sample.slotRetained = ptr.To(*rs.RetainedBytes)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.relays[key]
	sample.stalledAfter = prev.stalledAfter
	sample.labels = m.labelsLocked(key, prev)
	for _, c := range s.Conditions {
		if c.Type == string(v1alpha1.ConditionReady) {
			sample.isReady = c.Status == "True"
		}
		// Sorted by name, as the registry wants them.
		sample.conditions = append(sample.conditions, append(sample.labels[:2:2],
			m.pairLocked("reason", c.Reason), m.pairLocked("status", string(c.Status)), m.pairLocked("type", c.Type)))
	}
	m.relays[key] = sample
}

// labelsLocked returns the relay's label pairs, those of prev when it has
// them.
func (m *RelayMetrics) labelsLocked(key types.NamespacedName, prev relaySample) []*dto.LabelPair {
	if prev.labels != nil {
		return prev.labels
	}
	return []*dto.LabelPair{labelPair("name", key.Name), labelPair("namespace", key.Namespace)}
}

// SetStalledAfter records a relay's spec.backlog.stalledAfter, which alerts
// compare the age of the oldest pending row with.
func (m *RelayMetrics) SetStalledAfter(key types.NamespacedName, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.relays[key]
	s.stalledAfter = d
	s.labels = m.labelsLocked(key, s)
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
		m.slotRetained,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *RelayMetrics) Collect(ch chan<- prometheus.Metric) {
	now := m.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.relays {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- relayGauge{desc: d, labels: s.labels, value: v}
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
		if s.slotRetained != nil {
			gauge(m.slotRetained, float64(*s.slotRetained))
		}
		for _, labels := range s.conditions {
			ch <- relayGauge{desc: m.condition, labels: labels, value: 1}
		}
	}
}
