package backlog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redact"
)

// Cause says why a check failed, in terms a condition reason can name.
type Cause string

// The causes of a failed check.
const (
	// CauseInvalidDSN: the DSN could not be parsed.
	CauseInvalidDSN Cause = "InvalidDSN"
	// CauseUnreachable: no connection, a timeout, or a refused query.
	CauseUnreachable Cause = "Unreachable"
	// CauseTableNotFound: the outbox table or its schema does not exist.
	CauseTableNotFound Cause = "TableNotFound"
	// CauseColumnNotFound: a configured column does not exist.
	CauseColumnNotFound Cause = "ColumnNotFound"
)

// maxMessageLength bounds a failure's message; conditions and events carry it.
const maxMessageLength = 512

// Failure is a failed check, safe to show: Message names no password and no
// connection string.
type Failure struct {
	Cause   Cause
	Message string
}

// Error implements error.
func (f *Failure) Error() string { return string(f.Cause) + ": " + f.Message }

// classify turns the error of a check into a Failure. secrets are redacted
// from the message whatever the error's shape (the DSN and its password).
func classify(err error, timeout string, secrets ...string) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	cause, msg := CauseUnreachable, describe(err, timeout)
	var parseErr *pgconn.ParseConfigError
	switch {
	case errors.As(err, &parseErr):
		cause = CauseInvalidDSN
	case errors.Is(err, outbox.ErrTableNotFound):
		cause = CauseTableNotFound
	case errors.Is(err, outbox.ErrColumnNotFound):
		cause = CauseColumnNotFound
	}
	msg = redact.String(msg, secrets...)
	if len(msg) > maxMessageLength {
		msg = msg[:maxMessageLength] + "..."
	}
	return &Failure{Cause: cause, Message: msg}
}

// describe says what went wrong without quoting the connection settings:
// pgx's connect errors start with the user and database, and parse errors of
// net/url quote the whole URL, password included.
func describe(err error, timeout string) string {
	var (
		pgErr    *pgconn.PgError
		parseErr *pgconn.ParseConfigError
		opErr    *net.OpError
		dnsErr   *net.DNSError
		connErr  *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &parseErr):
		return "the DSN is not a valid PostgreSQL connection string (a postgres:// URL or key=value pairs)"
	case errors.As(err, &pgErr):
		what := "the query"
		if errors.As(err, &connErr) {
			what = "the connection"
		}
		return fmt.Sprintf("PostgreSQL refused %s: %s (SQLSTATE %s)", what, pgErr.Message, pgErr.Code)
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return "no answer from PostgreSQL within " + timeout
	case errors.As(err, &dnsErr):
		return "cannot connect to PostgreSQL: " + dnsErr.Error()
	case errors.As(err, &opErr):
		return "cannot connect to PostgreSQL: " + opErr.Error()
	case errors.As(err, &connErr):
		// The details after the user and database that Error starts with.
		return "cannot connect to PostgreSQL: " + singleLine(connErr.Unwrap().Error())
	}
	return singleLine(err.Error())
}

func singleLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
