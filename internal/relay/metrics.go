package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Error kinds, the values of the "kind" label of outbox_relay_errors_total.
const (
	ErrorKindPostgres     = "postgres"
	ErrorKindRedis        = "redis"
	ErrorKindTableMissing = "table_not_found"
	ErrorKindLayout       = "column_not_found"
	// ErrorKindDeadLetterTableMissing: a row had to be parked and the
	// dead-letter table does not exist.
	ErrorKindDeadLetterTableMissing = "dead_letter_table_not_found"
	// ErrorKindSlotInvalidated: the replication slot was invalidated
	// (source LogicalReplication) and is made again, with a catch-up.
	ErrorKindSlotInvalidated = "slot_invalidated"
	// ErrorKindSlotMissing: the replication slot, which the relay had
	// streamed from, was gone (dropped by hand, by a tool, or with its
	// OutboxRelay); the relay makes it again and publishes the gap from the
	// table, which has no rows deleted from it meanwhile.
	ErrorKindSlotMissing = "slot_missing"
	// ErrorKindSlotMoved: the replication slot was ahead of the position its
	// relays had confirmed (dropped and made again, or advanced, by hand or
	// by a tool, while no relay streamed); the relay publishes the gap from
	// the table, as for a missing slot.
	ErrorKindSlotMoved = "slot_moved"
	// ErrorKindPublicationChanged: the publication stopped publishing the
	// table's inserts, for a while or now (source LogicalReplication); the
	// relay publishes from the table what the slot skipped meanwhile.
	ErrorKindPublicationChanged = "publication_changed"
	// ErrorKindStreamCheck: Redis refused the look at the stream (XINFO
	// STREAM, XRANGE) that a batch makes before its XADDs, or the watch
	// between batches (an ACL without them, a proxy that lacks them): a
	// stream reset, entries that Redis lost, would go unnoticed.
	ErrorKindStreamCheck = "redis_stream_check"
	// ErrorKindDeleteCascades: cleanup mode OnDispatch claims nothing, as
	// deleting a claimed row would delete other outbox rows with it, never
	// published (a foreign key ON DELETE CASCADE within the table's tree).
	ErrorKindDeleteCascades = "delete_cascades"
	// ErrorKindTableShared: other relays of the outbox table publish to
	// other streams or with the other source (the relays table,
	// shared.go): a Polling relay claims nothing meanwhile, a slot's relay
	// streams on and says so.
	ErrorKindTableShared = "table_shared"
)

// The phases of outbox_relay_batch_phase_seconds, in a batch's order.
const (
	PhaseClaim   = "claim"
	PhaseQueued  = "queued"
	PhasePublish = "publish"
	PhaseCommit  = "commit"
)

var batchPhases = []string{PhaseClaim, PhaseQueued, PhasePublish, PhaseCommit}

// Metrics are the relay's Prometheus collectors.
type Metrics struct {
	EventsPublished    prometheus.Counter
	EventsDeadLettered prometheus.Counter
	Batches            prometheus.Counter
	// ClaimsOverBudget counts the claims rolled back for reading more than
	// BatchBytes.
	ClaimsOverBudget prometheus.Counter
	Errors           *prometheus.CounterVec
	BatchDuration    prometheus.Histogram
	// BatchPhase splits a batch's time (polling) into its phases: claim
	// (the statement), queued (claimed, waiting for the publisher: the
	// overlap of batches in flight), publish (the XADD pipeline) and commit.
	BatchPhase *prometheus.HistogramVec
	Lag        prometheus.Histogram
	Ready      prometheus.Gauge
	// stream: resets, trimming, replays (streamloss.go).
	stream *streamMetrics
}

// NewMetrics creates the collectors, not yet registered.
func NewMetrics() *Metrics {
	m := &Metrics{
		EventsPublished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_events_published_total",
			Help: "Outbox events added to the stream and committed as dispatched.",
		}),
		EventsDeadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_events_dead_lettered_total",
			Help: "Outbox rows that could not be published, parked in the dead-letter table and announced on the dead-letter stream.",
		}),
		Batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_batches_total",
			Help: "Batches committed (non-empty claims).",
		}),
		ClaimsOverBudget: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_claims_over_budget_total",
			Help: "Claims rolled back for reading more than the batch byte budget (--batch-bytes), then made again with the rows that fit.",
		}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_relay_errors_total",
			Help: "Failed passes, by kind: postgres, redis, table_not_found, column_not_found.",
		}, []string{"kind"}),
		BatchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_relay_batch_duration_seconds",
			Help:    "Time from claim to commit of a non-empty batch.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		BatchPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_relay_batch_phase_seconds",
			Help:    "Time a non-empty batch spent in each phase: claim, queued (waiting for the publisher), publish, commit.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"phase"}),
		Lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_relay_lag_seconds",
			Help:    "Time from an event's created_at to its publication.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_relay_ready",
			Help: "1 when the last pass reached PostgreSQL and Redis, else 0.",
		}),
	}
	for _, p := range batchPhases {
		m.BatchPhase.WithLabelValues(p)
	}
	m.stream = newStreamMetrics()
	for _, k := range []string{
		ErrorKindPostgres, ErrorKindRedis, ErrorKindTableMissing, ErrorKindLayout,
		ErrorKindDeadLetterTableMissing, ErrorKindRedisReplicas, ErrorKindSlotInvalidated, ErrorKindSlotMissing,
		ErrorKindSlotMoved, ErrorKindPublicationChanged, ErrorKindStreamCheck, ErrorKindDeleteCascades, ErrorKindTableShared,
	} {
		m.Errors.WithLabelValues(k)
	}
	return m
}

// Register registers every collector with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range append([]prometheus.Collector{
		m.EventsPublished, m.EventsDeadLettered, m.Batches, m.ClaimsOverBudget, m.Errors, m.BatchDuration, m.BatchPhase, m.Lag, m.Ready,
	}, m.stream.collectors()...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
