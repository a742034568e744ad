// Package outbox describes an outbox table as code: validated, quoted
// identifiers for the table and each of its columns, and every SQL statement
// the relay, the cleanup job, the controller and producers run against it
// (claim, backlog, cleanup, insert and DDL).
//
// Identifiers come from custom resources and flags, so they are validated
// against a conservative pattern and quoted with pgx.Identifier; they are never
// spliced into SQL as given. A name such as `x; DROP TABLE y` is refused by New
// before anything connects.
//
// Timestamps are read as timestamptz. A `timestamp without time zone` column is
// interpreted in the session's time zone, which Session sets to UTC, so tables
// written with UTC wall-clock times (as the reference implementation does) are
// read correctly.
package outbox
