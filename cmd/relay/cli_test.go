package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// noServers keeps a `relay run` that should fail from binding the default
// :8080 and :8081, should it start after all.
var noServers = []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"}

// closedDSN is a DSN with the canary password for a port nothing listens on.
func closedDSN(t *testing.T) string {
	return "postgres://app:" + canary + "@" + freeAddr(t) + "/app?sslmode=disable&connect_timeout=5"
}

func closedRedis(t *testing.T) string { return "redis://:" + canary + "@" + freeAddr(t) + "/0" }

func TestMissingConnectionVariables(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	redisURL := testenv.Redis(t)
	cases := []struct {
		name    string
		env     []string
		args    []string
		missing string
	}{
		{"run without DATABASE_URL", []string{"REDIS_URL=" + redisURL}, append([]string{"run"}, noServers...), "DATABASE_URL"},
		{"run with empty DATABASE_URL", []string{"DATABASE_URL=", "REDIS_URL=" + redisURL},
			append([]string{"run"}, noServers...), "DATABASE_URL"},
		{"run without REDIS_URL", []string{"DATABASE_URL=" + dsn}, append([]string{"run"}, noServers...), "REDIS_URL"},
		{"run with empty REDIS_URL", []string{"DATABASE_URL=" + dsn, "REDIS_URL="}, append([]string{"run"}, noServers...), "REDIS_URL"},
		{"run without either", nil, append([]string{"run"}, noServers...), "DATABASE_URL"},
		{"cleanup", []string{"REDIS_URL=" + redisURL}, []string{"cleanup"}, "DATABASE_URL"},
		{"backlog", []string{"REDIS_URL=" + redisURL}, []string{"backlog"}, "DATABASE_URL"},
		{"schema --apply", []string{"REDIS_URL=" + redisURL}, []string{"schema", "--apply"}, "DATABASE_URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := execRelay(t, relayEnv(tc.env...), tc.args...)
			require.NotZero(t, res.code)
			require.Contains(t, res.stderr, "relay: "+tc.missing+" is not set", "a clear message naming the variable")
			require.NotContains(t, res.stderr, "Relay started")
			require.Empty(t, res.stdout)
		})
	}
}

func TestInvalidIdentifiersAreRefusedBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := relayEnv("DATABASE_URL="+closedDSN(t), "REDIS_URL="+closedRedis(t))
	injections := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"table", []string{"--table", "x; DROP TABLE y"}, nil, `table "x; DROP TABLE y": invalid identifier`},
		{"table from env", nil, []string{"RELAY_TABLE=x; DROP TABLE y"}, `table "x; DROP TABLE y": invalid identifier`},
		{"schema", []string{"--table", `a"; DROP TABLE y; --.t`}, nil, `schema "a\"; DROP TABLE y; --": invalid identifier`},
		{"column", []string{"--payload-column", `p" || pg_sleep(10) || "`}, nil,
			`column payload "p\" || pg_sleep(10) || \"": invalid identifier`},
	}
	commands := [][]string{
		append([]string{"run"}, noServers...),
		{"cleanup"},
		{"backlog"},
		{"schema"},
		{"schema", "--apply"},
	}
	for _, inj := range injections {
		for _, cmd := range commands {
			name := cmd[0]
			if slices.Contains(cmd, "--apply") {
				name += " --apply"
			}
			t.Run(inj.name+" "+name, func(t *testing.T) {
				t.Parallel()
				res := execRelay(t, append(slices.Clone(env), inj.env...), append(slices.Clone(cmd), inj.args...)...)
				require.NotZero(t, res.code)
				require.Contains(t, res.stderr, inj.want)
				for _, conn := range []string{"connect", "refused", "dial", "127.0.0.1", "Relay started"} {
					require.NotContains(t, res.stderr, conn, "the identifier is refused before anything connects")
				}
				require.NotContains(t, res.stdout+res.stderr, canary)
				require.Empty(t, res.stdout, "no DDL printed for an invalid name")
			})
		}
	}
}

// flagRE finds the long flags in cobra's help output.
var flagRE = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)

// notSecret are flags whose names sound like a connection string but hold
// none: a path to a public CA certificate, an interval.
var notSecret = map[string]bool{"redis-ca-file": true, "redis-check-interval": true}

func TestNoConnectionStringFlag(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{{"--help"}, {"run", "--help"}, {"cleanup", "--help"}, {"backlog", "--help"}, {"schema", "--help"}} {
		res := requireSuccess(t, relayEnv(), cmd...)
		flags := flagRE.FindAllStringSubmatch(res.stdout, -1)
		require.NotEmpty(t, flags, "relay %v lists its flags:\n%s", cmd, res.stdout)
		for _, f := range flags {
			if notSecret[f[1]] {
				continue
			}
			for _, secret := range []string{"url", "dsn", "database", "redis", "password", "conn"} {
				require.NotContains(t, f[1], secret, "relay %v has a flag --%s", cmd, f[1])
			}
		}
		if cmd[0] == "run" {
			for _, want := range []string{"--stream", "--batch-size", "--table", "--health-probe-bind-address"} {
				require.Contains(t, res.stdout, want)
			}
		}
	}
	for _, flag := range []string{"--database-url", "--redis-url", "--dsn"} {
		res := execRelay(t, relayEnv(), "run", flag+"=postgres://app:"+canary+"@127.0.0.1/app")
		require.NotZero(t, res.code)
		require.Contains(t, res.stderr, "unknown flag: "+flag)
	}
}

func TestConnectionErrorsDoNotLeakPassword(t *testing.T) {
	t.Parallel()
	closedPort := strings.Split(freeAddr(t), ":")[1]
	dsns := map[string]string{
		"URL":       closedDSN(t),
		"key/value": "host=127.0.0.1 port=" + closedPort + " user=app password=" + canary + " dbname=app sslmode=disable connect_timeout=5",
		"quoted":    "host=127.0.0.1 port=" + closedPort + " user=app password='" + canary + "' dbname=app sslmode=disable",
		"bad port":  "postgres://app:" + canary + "@127.0.0.1:notaport/app",
		"bad query": "postgres://app:" + canary + "@127.0.0.1/app?sslmode=sometimes",
		// sslpassword unlocks the client key: as secret as the password.
		"sslpassword": "postgres://app@127.0.0.1:" + closedPort + "/app?sslmode=disable&sslpassword=" + canary,
	}
	for name, dsn := range dsns {
		for _, cmd := range [][]string{{"backlog"}, {"cleanup"}, {"schema", "--apply"}, append([]string{"run"}, noServers...)} {
			t.Run(name+" "+cmd[0], func(t *testing.T) {
				t.Parallel()
				// A REDIS_URL that does not parse: run must stop before it starts.
				res := execRelay(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL=redis://:"+canary+"@127.0.0.1:notaport/0"), cmd...)
				require.NotZero(t, res.code)
				require.NotContains(t, res.stdout+res.stderr, canary)
				require.True(t, strings.HasPrefix(res.stderr, "relay: "), "one error line: %s", res.stderr)
			})
		}
	}
}

func TestRunRetryLogsDoNotLeakPasswords(t *testing.T) {
	t.Parallel()
	t.Run("password", func(t *testing.T) {
		t.Parallel()
		testRunRetryLogs(t, closedDSN(t))
	})
	t.Run("sslpassword", func(t *testing.T) {
		t.Parallel()
		testRunRetryLogs(t, "postgres://app@"+freeAddr(t)+"/app?sslmode=disable&sslpassword="+canary)
	})
}

func testRunRetryLogs(t *testing.T, dsn string) {
	// Both servers unreachable: every pass fails, and every failure is logged.
	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+closedRedis(t)))
	waitUntil(t, r.relayProc, "a failed pass in the log", func() bool {
		_, ok := findLog(r.stderr.String(), "Relay pass failed, retrying")
		return ok
	})
	code, body := httpGet(r.url("/readyz"))
	require.Equal(t, 503, code, "/readyz: %s", body)
	require.NotContains(t, body, canary)
	started, ok := findLog(r.stderr.String(), "Relay started")
	require.True(t, ok)
	require.Contains(t, started["database"], "xxxxx", "the database is named with its secrets redacted")
	require.NotContains(t, started["database"], canary)
	sigterm(t, r.relayProc)
	require.NotContains(t, r.stdout.String()+r.stderr.String(), canary)
}
