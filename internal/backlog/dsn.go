package backlog

import (
	"errors"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// The DSN of an OutboxRelay is a tenant's input that the operator parses and
// dials in its own pod. Only the keys below are honoured; the parser refuses
// any other key before it reads a file or resolves a name (pgconn's
// ConnStringAllowedKeys), so a DSN cannot make the operator read its own
// files (a confused deputy).

// dsnKeys are the keys a DSN may set: where and as whom to connect, TLS
// without files, and server settings.
var dsnKeys = []string{
	"host", "port", "dbname", "database", "user", "password", "connect_timeout",
	"sslmode", "ssl", "sslnegotiation", "sslsni", "sslcertmode",
	"application_name", "target_session_attrs", "options", "search_path", "client_encoding", "timezone",
}

// FileKeys are the libpq keys that name files of the process that parses the
// DSN (or, service, a section of such a file). The operator refuses them
// unless it was started with --allow-dsn-file-keys; the relays, which run in
// the tenant's own pods, honour them.
var FileKeys = []string{"service", "servicefile", "passfile", "sslkey", "sslcert", "sslrootcert", "sslcrl", "sslcrldir"}

// DSNKeyError says that a DSN sets a key the operator does not honour.
type DSNKeyError struct {
	// Key is the refused key when it is a known libpq key, "" otherwise (a
	// key of the tenant's own making is not repeated: it could hold anything).
	Key string
}

func (e *DSNKeyError) Error() string {
	if e.Key == "" {
		return "the DSN sets a key the operator does not honour"
	}
	return "the DSN sets " + e.Key + ", a key the operator does not honour"
}

var notAllowedKey = regexp.MustCompile(`connection string key "([^"]*)" is not in ConnStringAllowedKeys`)

// ParseDSN parses a DSN honouring only the allowed keys (FileKeys too when
// allowFileKeys). A refused key is a *DSNKeyError, found before anything is
// read; a URL whose host holds an '@' is outbox.ErrDSNUserInfo; other
// errors are pgconn's (a *pgconn.ParseConfigError).
func ParseDSN(dsn string, allowFileKeys bool) (*pgconn.Config, error) {
	if outbox.HostHoldsAt(dsn) {
		// An unencoded '@' in the password: pgx would take its rest for
		// the host, and the relays refuse it (outbox.PoolConfig).
		return nil, outbox.ErrDSNUserInfo
	}
	allowed := dsnKeys
	if allowFileKeys {
		allowed = slices.Concat(dsnKeys, FileKeys)
	}
	cfg, err := pgconn.ParseConfigWithOptions(dsn, pgconn.ParseConfigOptions{ConnStringAllowedKeys: allowed})
	if err != nil {
		if m := notAllowedKey.FindStringSubmatch(err.Error()); m != nil {
			key := ""
			if slices.Contains(FileKeys, m[1]) || slices.Contains(knownKeys, m[1]) {
				key = m[1]
			}
			return nil, &DSNKeyError{Key: key}
		}
		return nil, err
	}
	return cfg, nil
}

// knownKeys are other libpq keys, named in a DSNKeyError.
var knownKeys = []string{
	"hostaddr", "sslpassword", "sslcompression", "requirepeer", "krbsrvname", "gsslib", "gssencmode",
	"gssdelegation", "channel_binding", "require_auth", "keepalives", "keepalives_idle", "keepalives_interval",
	"keepalives_count", "tcp_user_timeout", "replication", "load_balance_hosts", "min_read_buffer_size",
	"max_protocol_version", "min_protocol_version", "fallback_application_name", "sslkeylogfile",
}

// ValidDSN reports whether dsn is a PostgreSQL connection string, without
// reading any file: a DSN whose only fault is a refused key counts as valid
// (the relays may honour it; the backlog check reports the key).
func ValidDSN(dsn string) bool {
	_, err := ParseDSN(dsn, false)
	var keyErr *DSNKeyError
	return err == nil || errors.As(err, &keyErr)
}
