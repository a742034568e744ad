// Package monitoring tests what the project ships for Prometheus and
// Grafana: the alerts (config/prometheus/alerts.yaml) with `promtool test
// rules`, and the dashboard (config/grafana/outbox-operator.json), whose
// every query must parse and name only metrics the relay and the manager
// export (collected from their registries, not from a list). Each alert's
// runbook_url must lead to an entry of docs/operations.md, and so must every
// failure reason of the OutboxRelay's conditions.
//
// It is a module of its own, so that the Prometheus module (its PromQL
// parser) stays out of the product's dependencies; `make test` runs it.
package monitoring
