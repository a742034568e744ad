package backlog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	const secret = "Canary-Pa55word"
	dsn := "postgres://alice:" + secret + "@db.example:5432/app"
	_, parseErr := pgconn.ParseConfig("postgres://alice:" + secret + "@db.example:notaport/app")
	require.Error(t, parseErr)

	cases := []struct {
		name    string
		err     error
		cause   Cause
		message string
	}{
		{"Timeout", fmt.Errorf("measuring: %w", context.DeadlineExceeded), CauseUnreachable, "no answer from PostgreSQL within 10s"},
		{"TableNotFound", fmt.Errorf("%w: x: %w", outbox.ErrTableNotFound, &pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`}),
			CauseTableNotFound, `PostgreSQL refused the query: relation "x" does not exist (SQLSTATE 42P01)`},
		{"ColumnNotFound", fmt.Errorf("%w: x: %w", outbox.ErrColumnNotFound, &pgconn.PgError{Code: "42703", Message: `column "y" does not exist`}),
			CauseColumnNotFound, `PostgreSQL refused the query: column "y" does not exist (SQLSTATE 42703)`},
		{"ParseErrorNeverQuotesTheDSN", fmt.Errorf("parsing DSN: %w", parseErr), CauseInvalidDSN,
			"the DSN is not a valid PostgreSQL connection string (a postgres:// URL or key=value pairs)"},
		{"OtherErrorsAreRedacted", errors.New("driver said " + dsn), CauseUnreachable, "driver said xxxxx"},
		{"KnownFailurePassesThrough", &Failure{Cause: CauseInvalidDSN, Message: "m"}, CauseInvalidDSN, "m"},
		{"NoConnectionSlot", fmt.Errorf("connecting: %w: %w", errNoConnSlot, context.DeadlineExceeded), CauseUnreachable,
			"the operator's bound on open backlog connections (--backlog-max-open-conns) was reached until the deadline; the check is retried"},
		{"PoolBusy", fmt.Errorf("connecting: %w: %w", errPoolBusy, context.DeadlineExceeded), CauseUnreachable,
			"every backlog connection to this database (--backlog-max-conns) stayed in use until the deadline; the check is retried"},
		{"ConnectTimeoutSaysUnreachable", fmt.Errorf("%w: %w", errConnect, context.DeadlineExceeded), CauseUnreachable, unreachableMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := classify(tc.err, "10s", dsn, secret)
			require.Equal(t, tc.cause, f.Cause)
			require.Equal(t, tc.message, f.Message)
			require.NotContains(t, f.Error(), secret)
		})
	}
}

func TestPasswordOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, "pw", passwordOf("postgres://u:pw@h/db", false))
	require.Equal(t, "pw", passwordOf("host=h user=u password=pw", false))
	require.Empty(t, passwordOf("postgres://u:pw@h:bad/db", false))
	require.Empty(t, passwordOf("host=h user=u password=pw sslrootcert=/etc/passwd", false), "a refused key reads nothing")
}

func TestNetworkErrorsSayOnlyUnreachable(t *testing.T) {
	t.Parallel()
	// A port nothing listens on, and one that accepts and never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	connect := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		conn, err := pgconn.Connect(ctx, "postgres://u:pw@"+addr+"/db?sslmode=disable")
		if err == nil {
			_ = conn.Close(ctx)
		}
		return err
	}
	for name, err := range map[string]error{
		"Refused":   connect(closed),
		"Blackhole": connect(silent.Addr().String()),
		"NoRoute":   &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: no route to host")},
		"DNS":       &net.DNSError{Err: "no such host", Name: "db.internal.corp"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := classify(fmt.Errorf("measuring: %w", err), "10s")
			require.Equal(t, CauseUnreachable, f.Cause)
			require.Equal(t, unreachableMessage, f.Message)
		})
	}
}

func TestDSNKeys(t *testing.T) {
	t.Parallel()
	for _, key := range FileKeys {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			for _, dsn := range []string{
				"host=127.0.0.1 user=u password=Canary-Pa55word " + key + "=/etc/shadow",
				"postgres://u:Canary-Pa55word@127.0.0.1/db?" + key + "=/etc/shadow",
			} {
				_, err := ParseDSN(dsn, false)
				var keyErr *DSNKeyError
				require.ErrorAs(t, err, &keyErr, dsn)
				require.Equal(t, key, keyErr.Key)
				f := classify(fmt.Errorf("parsing DSN: %w", err), "10s", dsn, "Canary-Pa55word")
				require.Equal(t, CauseDSNKeyNotAllowed, f.Cause)
				require.Contains(t, f.Message, "the DSN sets "+key+";")
				require.NotContains(t, f.Message, "Canary")
				require.NotContains(t, f.Message, "/etc/shadow")
				require.True(t, ValidDSN(dsn), "the relays may honour it: the Secret still resolves")
			}
		})
	}
	t.Run("AllowedByFlag", func(t *testing.T) {
		t.Parallel()
		_, err := ParseDSN("host=127.0.0.1 user=u sslmode=disable sslcrldir=/nonexistent", true)
		require.NoError(t, err)
	})
	t.Run("UnknownKeyIsNotRepeated", func(t *testing.T) {
		t.Parallel()
		_, err := ParseDSN("host=127.0.0.1 Canary-Pa55word=x", false)
		var keyErr *DSNKeyError
		require.ErrorAs(t, err, &keyErr)
		require.Empty(t, keyErr.Key)
		require.NotContains(t, classify(err, "10s").Message, "Canary")
	})
	t.Run("OrdinaryKeys", func(t *testing.T) {
		t.Parallel()
		cfg, err := ParseDSN("postgres://u:pw@127.0.0.1:5433/db?sslmode=disable&application_name=a&connect_timeout=3&search_path=s", false)
		require.NoError(t, err)
		require.Equal(t, uint16(5433), cfg.Port)
		require.False(t, ValidDSN("postgres://u:pw@h:bad/db"))
	})
	t.Run("UnencodedAtInThePassword", func(t *testing.T) {
		t.Parallel()
		// pgx would read the host "Canary@127.0.0.1" and quote it in every
		// connect error; the relays refuse it, and so does the operator.
		dsn := "postgres://u:pw@Canary@127.0.0.1:5433/db"
		require.False(t, ValidDSN(dsn))
		_, err := ParseDSN(dsn, false)
		f := classify(err, "10s")
		require.Equal(t, CauseInvalidDSN, f.Cause)
		require.Contains(t, f.Message, "%40")
		require.NotContains(t, f.Message, "Canary")
		require.True(t, ValidDSN("postgres://u:pw%40Canary@127.0.0.1:5433/db"), "percent-encoded")
	})
}
