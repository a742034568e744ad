package backlog

import "github.com/jackc/pgx/v5/pgconn"

// passwordOf returns the password in a DSN, to redact it from messages; ""
// when the DSN cannot be parsed (its text is redacted whole then).
func passwordOf(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	return cfg.Password
}
