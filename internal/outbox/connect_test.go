package outbox

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
)

// TestPoolConfigNeverEchoesThePassword: the relay's commands print
// PoolConfig's error (and log the errors of the connections it configures),
// so neither may hold any part of a password, also one that pgx misreads:
// spaces around '=' or an escaped space in a key/value DSN (pgx's own
// redaction of its parse errors misses those), or an unencoded '@' in a
// URL's password (pgx ends the user info at the first '@', so the rest of
// the password becomes the host, which every connect error quotes).
func TestPoolConfigNeverEchoesThePassword(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, fragment string }{
		{"host=127.0.0.1 password = s3cretcanary port=x", "s3cretcanary"},
		{`host=127.0.0.1 password=s3cret\ canarytail port=x`, "canarytail"},
		{"postgres://relay:s3cret@canarytail@127.0.0.1:x/db", "canarytail"},
		{"postgres://relay:s3cret@canary tail@127.0.0.1/db", "canary tail"},
		{"postgres://relay:s3cret@canarytail@127.0.0.1:5432/db", "canarytail"},
		{"postgres://relay:s3cret@canarytail@127.0.0.1/db", "canarytail"},
		{"postgres://relay:s3cret@canarytail@h1,h2:5433/db", "canarytail"},
	} {
		cfg, err := PoolConfig(tc.dsn, SessionSettings{}, 1)
		if err != nil {
			assert.NotContains(t, err.Error(), tc.fragment, tc.dsn)
			continue
		}
		assert.NotContains(t, connectionSettings(cfg), tc.fragment,
			"%s: parsed, but part of the password landed outside it (a connect error quotes it)", tc.dsn)
	}
	for _, ok := range []string{
		"postgres://relay:s3cret%40canary@127.0.0.1:5432/db",
		"postgres://relay:s3cret@127.0.0.1/db?application_name=relay@orders",
		"postgresql://relay@127.0.0.1,[::1]:5433/db",
		"host=127.0.0.1 password='s3cret @canary' port=5432",
	} {
		_, err := PoolConfig(ok, SessionSettings{}, 1)
		assert.NoError(t, err, ok)
	}
}

// connectionSettings are the settings of cfg other than the password that
// pgx's errors may quote: hosts, user, database, runtime parameters.
func connectionSettings(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	s := make([]string, 0, 3+len(c.Fallbacks)+2*len(c.RuntimeParams))
	s = append(s, c.Host, c.User, c.Database)
	for _, fb := range c.Fallbacks {
		s = append(s, fb.Host)
	}
	for k, v := range c.RuntimeParams {
		s = append(s, k, v)
	}
	return strings.Join(s, " ")
}
