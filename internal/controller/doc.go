// Package controller reconciles OutboxRelays: for each one a relay
// Deployment and a cleanup CronJob, both built by pure functions of this
// package (RelayDeployment, CleanupCronJob) and owned by the OutboxRelay; the
// backlog measured off the reconcile path (internal/backlog); the replica
// count from the backlog (internal/scaling); and a status with typed
// conditions, written once per reconcile and only when it changed.
//
// Files are named by resource and verb: outboxrelay_controller.go (RBAC
// markers, Reconcile, SetupWithManager), outboxrelay_secrets.go and
// secretcache.go (reading the Secrets), outboxrelay_resources.go (reading
// and writing the children), outboxrelay_status.go (conditions as an ordered
// chain of checks), deployment.go, cronjob.go and pod.go (builders),
// labels.go (every label and annotation key), cache.go (the manager's cache
// settings), metrics.go. docs/controller.md explains the design.
package controller
