package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestURL(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"postgres://app:s3cret@db:5432/app?sslmode=disable":        "postgres://app:xxxxx@db:5432/app?sslmode=disable",
		"postgres://app@db/app":                                    "postgres://app@db/app",
		"postgres://db/app?password=s3cret":                        "postgres://db/app?password=xxxxx",
		"postgres://db/app?sslmode=verify-full&sslpassword=s3cret": "postgres://db/app?sslmode=verify-full&sslpassword=xxxxx",
		"host=db sslpassword=s3cret":                               "host=db sslpassword=xxxxx",
		"redis://:s3cret@redis:6379/0":                             "redis://:xxxxx@redis:6379/0",
		"host=db user=app password=s3cret dbname=app":              "host=db user=app password=xxxxx dbname=app",
		"host=db password='s3 cret' dbname=app":                    "host=db password=xxxxx dbname=app",
		"postgres://app:s%3Fcret@db%zz/app":                        "xxxxx",
		// libpq's escapes in an unquoted value: the space belongs to it.
		`host=db password=s3cret\ tail dbname=app`: "host=db password=xxxxx dbname=app",
		`host=db password = s3cret\\ dbname=app`:   "host=db password = xxxxx dbname=app",
		`host=db password=s3cret\`:                 "host=db password=xxxxx",
	}
	for in, want := range cases {
		require.Equal(t, want, URL(in), in)
		require.NotContains(t, URL(in), "s3cret")
	}
}

func TestString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "failed for xxxxx at xxxxx", String("failed for canary at canary", "canary", ""))
}
