package doctor

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func itoa(i int) string { return strconv.Itoa(i) }

// withUser returns dsn (a URL) with another user and no password: the
// test server trusts loopback.
func withUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.User(user)
	return u.String()
}
