package backlog

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
	require.Equal(t, "pw", passwordOf("postgres://u:pw@h/db"))
	require.Equal(t, "pw", passwordOf("host=h user=u password=pw"))
	require.Empty(t, passwordOf("postgres://u:pw@h:bad/db"))
}
