// Package faults is the fault suite of the relay (make test-faults): the
// real relay binary, run as processes against real PostgreSQL and Redis
// servers, with its links cut by an in-process toxiproxy and its processes
// killed and stopped by signals, judged by a checker that compares every
// committed outbox row with every stream entry.
//
// Each case runs as subtests named by the relay's cleanup mode
// (TestKills/AfterRetention, TestKills/OnDispatch): one piece of code judges
// both, from the producers' record of what committed, since OnDispatch
// deletes the rows it dispatches. TestReplication and
// TestReplicationChildren (source LogicalReplication) run once: a slot's
// relay marks and deletes nothing.
// The CI slice runs some cases in AfterRetention only (their OnDispatch
// subtests exist at FAULTS_SCALE=full).
//
// The cases build only with -tags faults, so that go test ./... (make test)
// runs just the checker's unit test. FAULTS_SCALE=full runs the sizes of
// issue #10; the default is a CI slice of a few minutes on two cores.
// docs/reliability.md has the figures.
package faults
