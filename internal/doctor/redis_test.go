package doctor

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEvictionCheck(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		facts  RedisFacts
		status Status
		reason string
	}{
		{"no maxmemory", RedisFacts{Config: map[string]string{"maxmemory": "0", "maxmemory-policy": "allkeys-lru"}}, OK, ReasonEvictionSafe},
		{"noeviction under a limit", RedisFacts{Config: map[string]string{"maxmemory": "104857600", "maxmemory-policy": "noeviction"}}, OK, ReasonEvictionSafe},
		{"allkeys-lru under a limit", RedisFacts{Config: map[string]string{"maxmemory": "104857600", "maxmemory-policy": "allkeys-lru"}}, Fail, ReasonEvictionUnsafe},
		{"volatile-ttl under a limit", RedisFacts{Config: map[string]string{"maxmemory": "1", "maxmemory-policy": "volatile-ttl"}}, Fail, ReasonEvictionUnsafe},
		{"CONFIG denied, INFO tells", RedisFacts{ConfigErr: "NOPERM", Info: map[string]string{"maxmemory": "5", "maxmemory_policy": "allkeys-random"}}, Fail, ReasonEvictionUnsafe},
		{"CONFIG and INFO denied", RedisFacts{ConfigErr: "ERR unknown command 'CONFIG'", InfoErr: "NOPERM"}, Warn, ReasonCheckUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := EvictionCheck(tc.facts)
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, tc.reason, c.Reason)
			if c.Status != OK {
				require.NotEmpty(t, c.Fix)
			}
		})
	}
}

func TestPersistenceCheck(t *testing.T) {
	t.Parallel()
	cfg := func(aof, fsync, save string) map[string]string {
		return map[string]string{"appendonly": aof, "appendfsync": fsync, "save": save}
	}
	cases := []struct {
		name   string
		facts  RedisFacts
		status Status
		reason string
	}{
		{"aof always", RedisFacts{Config: cfg("yes", "always", "")}, OK, ReasonPersistent},
		{"aof everysec", RedisFacts{Config: cfg("yes", "everysec", "3600 1")}, OK, ReasonPersistent},
		{"aof no fsync", RedisFacts{Config: cfg("yes", "no", "")}, Warn, ReasonFsyncLax},
		{"rdb only", RedisFacts{Config: cfg("no", "everysec", "3600 1 300 100")}, Warn, ReasonPersistenceWeak},
		{"nothing", RedisFacts{Config: cfg("no", "everysec", "")}, Fail, ReasonPersistenceOff},
		{"CONFIG denied, AOF on per INFO", RedisFacts{ConfigErr: "NOPERM", Info: map[string]string{"aof_enabled": "1"}}, OK, ReasonPersistent},
		{"CONFIG denied, AOF off per INFO", RedisFacts{ConfigErr: "NOPERM", Info: map[string]string{"aof_enabled": "0"}}, Warn, ReasonCheckUnknown},
		{"all denied", RedisFacts{ConfigErr: "NOPERM", InfoErr: "NOPERM"}, Warn, ReasonCheckUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := PersistenceCheck(tc.facts)
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, tc.reason, c.Reason)
		})
	}
}

func TestRoleAndReplicasChecks(t *testing.T) {
	t.Parallel()
	replica := RedisFacts{Info: map[string]string{"role": "slave", "master_host": "10.0.0.1", "master_port": "6379"}}
	require.Equal(t, Fail, RoleCheck(replica).Status)
	require.Equal(t, ReasonReadOnlyReplica, RoleCheck(replica).Reason)
	require.Equal(t, Warn, RoleCheck(RedisFacts{InfoErr: "NOPERM"}).Status)

	lone := RedisFacts{Info: map[string]string{"role": "master", "connected_slaves": "0"}}
	require.Equal(t, OK, RoleCheck(lone).Status)
	require.Equal(t, Info, ReplicasCheck(lone).Status)
	require.Equal(t, ReasonNoReplica, ReplicasCheck(lone).Reason)

	two := RedisFacts{Info: ParseInfo("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
		"slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n" +
		"slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=3\r\n")}
	c := ReplicasCheck(two)
	require.Equal(t, Warn, c.Status, c.Message)
	require.Contains(t, c.Message, "127.0.0.1:7002 wait_bgsave")
}

func TestKeyAndGroupChecks(t *testing.T) {
	t.Parallel()
	f := RedisFacts{Keys: map[string]string{"jobs": "stream", "jobs.dead": "none", "other": "string"},
		KeyErrs: map[string]string{"denied": "NOPERM"}}
	require.Equal(t, OK, KeyTypeCheck("redis.stream", "jobs", f).Status)
	require.Equal(t, OK, KeyTypeCheck("redis.stream", "jobs.dead", f).Status)
	require.Equal(t, Fail, KeyTypeCheck("redis.stream", "other", f).Status)
	require.Equal(t, ReasonWrongType, KeyTypeCheck("redis.stream", "other", f).Reason)
	require.Equal(t, Warn, KeyTypeCheck("redis.stream", "denied", f).Status)

	require.Equal(t, Info, GroupsCheck("jobs", RedisFacts{}).Status)
	g := GroupsCheck("jobs", RedisFacts{Groups: []Group{{Name: "workers", Consumers: 2, Pending: 3, Lag: 7}, {Name: "audit", Lag: -1}}})
	require.Equal(t, OK, g.Status)
	require.Contains(t, g.Message, "workers (2 consumers, lag 7, pending 3)")
	require.Contains(t, g.Message, "audit (0 consumers, lag unknown")
}

func TestConnectionCheck(t *testing.T) {
	t.Parallel()
	r := DurabilityChecks(RedisFacts{ConnectErr: "WRONGPASS invalid username-password pair", AuthFailed: true})
	require.Len(t, r, 1)
	require.Equal(t, ReasonAuthFailed, r[0].Reason)
	require.Equal(t, ReasonUnreachable, ConnectionCheck(RedisFacts{ConnectErr: "dial tcp: connection refused"}).Reason)
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	durable := RedisFacts{
		Config: map[string]string{"appendonly": "yes", "appendfsync": "everysec", "save": "", "maxmemory": "0", "maxmemory-policy": "noeviction"},
		Info:   map[string]string{"role": "master", "connected_slaves": "0"},
	}
	s := Summarize(DurabilityChecks(durable))
	require.Equal(t, Summary{"True", ReasonDurable, s.Message}, s)

	evicting := durable
	evicting.Config = map[string]string{"appendonly": "no", "save": "", "maxmemory": "100", "maxmemory-policy": "allkeys-lru"}
	s = Summarize(DurabilityChecks(evicting))
	require.Equal(t, "False", s.Status)
	require.Equal(t, ReasonEvictionUnsafe, s.Reason, "eviction is reported before persistence")
	require.Contains(t, s.Message, "Fix: CONFIG SET maxmemory-policy noeviction")

	rdb := durable
	rdb.Config = map[string]string{"appendonly": "no", "save": "3600 1", "maxmemory": "0", "maxmemory-policy": "noeviction"}
	require.Equal(t, Summary{"False", ReasonPersistenceWeak, Summarize(DurabilityChecks(rdb)).Message}, Summarize(DurabilityChecks(rdb)))

	denied := RedisFacts{ConfigErr: "ERR unknown command 'CONFIG'",
		Info: map[string]string{"role": "master", "aof_enabled": "1", "maxmemory": "0", "maxmemory_policy": "noeviction"}}
	require.Equal(t, "True", Summarize(DurabilityChecks(denied)).Status, "INFO alone can tell")
	denied.Info = nil
	denied.InfoErr = "NOPERM"
	s = Summarize(DurabilityChecks(denied))
	require.Equal(t, "Unknown", s.Status)
	require.Equal(t, ReasonCheckUnknown, s.Reason)

	s = Summarize(DurabilityChecks(RedisFacts{ConnectErr: "i/o timeout"}))
	require.Equal(t, Summary{"Unknown", ReasonUnreachable, s.Message}, s)
}

func TestReportOutput(t *testing.T) {
	t.Parallel()
	r := Report{
		{Name: "redis.eviction", Status: Fail, Reason: ReasonEvictionUnsafe, Message: "bad.", Fix: "fix it."},
		{Name: "outbox.table", Status: OK, Message: "fine."},
	}
	require.True(t, r.Failed())
	require.Equal(t, "redis.eviction", r.Worst().Name)
	var text bytes.Buffer
	require.NoError(t, r.WriteText(&text))
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	require.Len(t, lines, 2)
	require.Regexp(t, `^fail\s+redis.eviction\s+bad. Fix: fix it.$`, lines[0])
	var out struct {
		OK     bool    `json:"ok"`
		Checks []Check `json:"checks"`
	}
	var js bytes.Buffer
	require.NoError(t, r.WriteJSON(&js))
	require.NoError(t, json.Unmarshal(js.Bytes(), &out))
	require.False(t, out.OK)
	require.Equal(t, r[0], out.Checks[0])
}
