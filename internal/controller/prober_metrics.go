package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-dev/outbox-operator/internal/backlog"
)

// probeCollector exports the bounds of the backlog prober and how close to
// them it runs:
//
//	outbox_operator_backlog_checks_running              checks running now
//	outbox_operator_backlog_checks_waiting              due checks waiting for a slot
//	outbox_operator_backlog_checks_max                  --backlog-max-concurrent-checks
//	outbox_operator_backlog_connections_open            PostgreSQL connections open now, every pool
//	outbox_operator_backlog_connections_waiting         dials waiting for a connection slot
//	outbox_operator_backlog_connections_max             --backlog-max-open-conns
//	outbox_operator_backlog_pools                       connection pools (one per namespace and DSN)
type probeCollector struct {
	prober *backlog.Prober
	conns  interface{ ConnStats() backlog.ConnStats }

	checksRunning, checksWaiting, checksMax, connsOpen, connsWaiting, connsMax, pools *prometheus.Desc
}

var _ prometheus.Collector = (*probeCollector)(nil)

func newProbeCollector(p *backlog.Prober, m backlog.Measurer) *probeCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_operator_backlog_"+name, help, nil, nil)
	}
	c := &probeCollector{
		prober:        p,
		checksRunning: desc("checks_running", "Backlog checks running now."),
		checksWaiting: desc("checks_waiting", "Due backlog checks waiting for a free slot (--backlog-max-concurrent-checks)."),
		checksMax:     desc("checks_max", "Most backlog checks that run at once (--backlog-max-concurrent-checks)."),
		connsOpen:     desc("connections_open", "PostgreSQL connections of the backlog checks open now, across every pool."),
		connsWaiting:  desc("connections_waiting", "Backlog connections waiting for a free slot (--backlog-max-open-conns)."),
		connsMax:      desc("connections_max", "Most PostgreSQL connections the backlog checks open at once (--backlog-max-open-conns)."),
		pools:         desc("pools", "Connection pools of the backlog checks (one per namespace and DSN)."),
	}
	c.conns, _ = m.(interface{ ConnStats() backlog.ConnStats })
	return c
}

// Describe implements prometheus.Collector.
func (c *probeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.checksRunning, c.checksWaiting, c.checksMax, c.connsOpen, c.connsWaiting, c.connsMax, c.pools} {
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
	if c.conns != nil {
		cs := c.conns.ConnStats()
		gauge(c.connsOpen, cs.Open)
		gauge(c.connsWaiting, cs.Waiting)
		gauge(c.connsMax, cs.Max)
		gauge(c.pools, cs.Pools)
	}
}

// ProbeCollector returns the metrics of the backlog prober's bounds; call it
// after SetupWithManager and register it with the manager's registry.
func (r *OutboxRelayReconciler) ProbeCollector() prometheus.Collector { return r.probeStats }
