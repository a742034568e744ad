package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-dev/outbox-operator/internal/backlog"
)

// probeCollector exports the bounds of the backlog prober and how close to
// them it runs:
//
//	outbox_operator_backlog_checks_running              checks running their queries now
//	outbox_operator_backlog_checks_waiting              due checks queued for a dial slot
//	outbox_operator_backlog_checks_max                  --backlog-max-concurrent-checks
//	outbox_operator_backlog_dials_running               checks holding a dial slot (connecting, or connected and waiting for a check slot)
//	outbox_operator_backlog_dials_max                   --backlog-max-concurrent-dials
//	outbox_operator_backlog_connections_open            PostgreSQL connections open now (being made included), every pool
//	outbox_operator_backlog_connections_dialing         PostgreSQL connections being made now
//	outbox_operator_backlog_connections_waiting         checks waiting for a connection
//	outbox_operator_backlog_connections_max             --backlog-max-open-conns
//	outbox_operator_backlog_pools                       connection pools (one per namespace and DSN)
type probeCollector struct {
	prober *backlog.Prober
	conns  interface{ ConnStats() backlog.ConnStats }

	checksRunning, checksWaiting, checksMax, dialsRunning, dialsMax *prometheus.Desc
	connsOpen, connsDialing, connsWaiting, connsMax, pools          *prometheus.Desc
}

var _ prometheus.Collector = (*probeCollector)(nil)

func newProbeCollector(p *backlog.Prober, m backlog.Measurer) *probeCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_operator_backlog_"+name, help, nil, nil)
	}
	c := &probeCollector{
		prober:        p,
		checksRunning: desc("checks_running", "Backlog checks running their queries now."),
		checksWaiting: desc("checks_waiting", "Due backlog checks queued for a dial slot (--backlog-max-concurrent-dials)."),
		checksMax:     desc("checks_max", "Most backlog checks that run their queries at once (--backlog-max-concurrent-checks)."),
		dialsRunning: desc("dials_running",
			"Backlog checks holding a dial slot: getting a connection, or holding one and waiting for a check slot."),
		dialsMax:     desc("dials_max", "Most backlog checks that get a connection at once (--backlog-max-concurrent-dials)."),
		connsOpen:    desc("connections_open", "PostgreSQL connections of the backlog checks open now (being made included), across every pool."),
		connsDialing: desc("connections_dialing", "PostgreSQL connections of the backlog checks being made now."),
		connsWaiting: desc("connections_waiting",
			"Backlog checks waiting for a connection (--backlog-max-open-conns reached, or every connection of their pool in use)."),
		connsMax: desc("connections_max", "Most PostgreSQL connections the backlog checks open at once (--backlog-max-open-conns)."),
		pools:    desc("pools", "Connection pools of the backlog checks (one per namespace and DSN)."),
	}
	c.conns, _ = m.(interface{ ConnStats() backlog.ConnStats })
	return c
}

// Describe implements prometheus.Collector.
func (c *probeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.checksRunning, c.checksWaiting, c.checksMax, c.dialsRunning, c.dialsMax,
		c.connsOpen, c.connsDialing, c.connsWaiting, c.connsMax, c.pools,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *probeCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	s := c.prober.CheckStats()
	gauge(c.checksRunning, s.Running)
	gauge(c.checksWaiting, s.Waiting)
	gauge(c.checksMax, s.Max)
	gauge(c.dialsRunning, s.Dialing)
	gauge(c.dialsMax, s.MaxDials)
	if c.conns != nil {
		cs := c.conns.ConnStats()
		gauge(c.connsOpen, cs.Open)
		gauge(c.connsDialing, cs.Dialing)
		gauge(c.connsWaiting, cs.Waiting)
		gauge(c.connsMax, cs.Max)
		gauge(c.pools, cs.Pools)
	}
}

// ProbeCollector returns the metrics of the backlog prober's bounds; call it
// after SetupWithManager and register it with the manager's registry.
func (r *OutboxRelayReconciler) ProbeCollector() prometheus.Collector { return r.probeStats }
