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
	// CauseDSNKeyNotAllowed: the DSN sets a key the operator does not
	// honour (a file-reading key such as sslrootcert, or an unknown one).
	CauseDSNKeyNotAllowed Cause = "DSNKeyNotAllowed"
)

// unreachableMessage is all a failed connection says: the address, the
// error class (refused, no route, a timeout, a name not resolved, a TLS
// failure) would let a tenant map the network the operator sees through the
// DSNs it writes. The relays' own logs, in the tenant's namespace, have the
// details of their own connections.
const unreachableMessage = "PostgreSQL is unreachable from the operator (no connection could be made; the relays' logs have the details)"

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

// answered reports that the database answered the check and said that the
// outbox table or one of its columns does not exist (false for nil).
func (f *Failure) answered() bool {
	return f != nil && (f.Cause == CauseTableNotFound || f.Cause == CauseColumnNotFound)
}

// classify turns the error of a check into a Failure. secrets are redacted
// from the message whatever the error's shape (the DSN and its password).
func classify(err error, timeout string, secrets ...string) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	cause, msg := CauseUnreachable, describe(err, timeout)
	var (
		parseErr *pgconn.ParseConfigError
		keyErr   *DSNKeyError
	)
	switch {
	case errors.As(err, &keyErr):
		cause = CauseDSNKeyNotAllowed
	case errors.As(err, &parseErr), errors.Is(err, outbox.ErrDSNUserInfo):
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
		keyErr   *DSNKeyError
		opErr    *net.OpError
		dnsErr   *net.DNSError
		connErr  *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &keyErr):
		what := "a key that is not allowed"
		if keyErr.Key != "" {
			what = keyErr.Key
		}
		return "the DSN sets " + what + "; the operator honours only " + strings.Join(dsnKeys, ", ") +
			" (the file-reading keys only when started with --allow-dsn-file-keys), so it does not measure this backlog;" +
			" the relays still use the DSN"
	case errors.Is(err, outbox.ErrDSNUserInfo):
		return "the DSN is a postgres:// URL whose host holds an '@': percent-encode '@' in the user and password as %40"
	case errors.As(err, &parseErr):
		return "the DSN is not a valid PostgreSQL connection string (a postgres:// URL or key=value pairs)"
	case errors.As(err, &pgErr):
		what := "the query"
		if errors.As(err, &connErr) {
			what = "the connection"
		}
		return fmt.Sprintf("PostgreSQL refused %s: %s (SQLSTATE %s)", what, pgErr.Message, pgErr.Code)
	case errors.Is(err, errNoConnSlot):
		return "the operator's bound on open backlog connections (--backlog-max-open-conns) was reached until the deadline; the check is retried"
	case errors.Is(err, errPoolBusy):
		return "every backlog connection to this database (--backlog-max-conns) stayed in use until the deadline; the check is retried"
	case errors.Is(err, errConnect), errors.As(err, &connErr), errors.As(err, &dnsErr), errors.As(err, &opErr):
		// Whatever kept the connection from being made: see
		// unreachableMessage.
		return unreachableMessage
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return "no answer from PostgreSQL within " + timeout
	}
	return singleLine(err.Error())
}

func singleLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
