package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/redisconn"
)

// configParams are the settings read with CONFIG GET, one call each (CONFIG
// GET takes several only from Redis 7 on).
var configParams = []string{"appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy"}

// RedisFacts is what GatherRedis learnt from a server. Every field may be
// missing: a managed Redis denies or renames CONFIG, an ACL user may lack
// INFO. The checks say "unknown" then.
type RedisFacts struct {
	// ConnectErr is why PING failed; "" when it answered.
	ConnectErr string
	// AuthFailed tells an authentication failure (NOAUTH, WRONGPASS) from
	// others.
	AuthFailed bool
	// Config holds the CONFIG GET values; nil when CONFIG was refused.
	Config map[string]string
	// ConfigErr is why CONFIG GET failed.
	ConfigErr string
	// Info holds the fields of INFO server, persistence, memory and
	// replication; nil when INFO was refused.
	Info map[string]string
	// InfoErr is why INFO failed.
	InfoErr string
	// Keys maps each checked key (the stream, the dead-letter stream) to
	// its TYPE ("none" when absent); a key whose TYPE failed is in KeyErrs.
	Keys    map[string]string
	KeyErrs map[string]string
	// Groups are the consumer groups of the stream (XINFO GROUPS); nil
	// when the stream does not exist.
	Groups []Group
	// GroupsErr is why XINFO GROUPS failed.
	GroupsErr string
	// StreamCheckErr is the error reply to the look at the stream that the
	// relay makes before each batch (XINFO STREAM, XRANGE): an ACL or a
	// proxy that refuses it. A missing stream is no error.
	StreamCheckErr string
}

// Group is one consumer group of the stream.
type Group struct {
	Name      string `json:"name"`
	Consumers int64  `json:"consumers"`
	// Pending entries were delivered and not acknowledged yet.
	Pending int64 `json:"pending"`
	// Lag counts entries not delivered to the group yet; -1 when Redis
	// cannot tell (after a deletion or trimming in the stream).
	Lag int64 `json:"lag"`
}

// RedisTarget is what the Redis checks look at.
type RedisTarget struct {
	// Stream and DeadLetterStream are the relay's keys.
	Stream, DeadLetterStream string
}

// GatherRedis asks the server for the facts of the checks. It never fails:
// what it cannot learn is recorded as an error string in the facts. In a
// cluster, the server-level facts (CONFIG, INFO) are those of the master
// that holds the stream.
func GatherRedis(ctx context.Context, rdb redis.UniversalClient, t RedisTarget) RedisFacts {
	var f RedisFacts
	if err := rdb.Ping(ctx).Err(); err != nil {
		f.ConnectErr = errText(err)
		f.AuthFailed = isAuthError(err)
		return f
	}
	node, err := redisconn.NodeFor(ctx, rdb, t.Stream)
	if err != nil {
		f.ConnectErr = errText(err)
		return f
	}
	f.Config = map[string]string{}
	for _, p := range configParams {
		m, err := node.ConfigGet(ctx, p).Result()
		if err != nil {
			f.Config, f.ConfigErr = nil, errText(err)
			break
		}
		if v, ok := m[p]; ok {
			f.Config[p] = v
		}
	}
	if raw, err := node.Info(ctx, "server", "persistence", "memory", "replication").Result(); err != nil {
		f.InfoErr = errText(err)
	} else {
		f.Info = ParseInfo(raw)
	}
	f.Keys, f.KeyErrs = map[string]string{}, map[string]string{}
	for _, k := range []string{t.Stream, t.DeadLetterStream} {
		if k == "" {
			continue
		}
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			f.KeyErrs[k] = errText(err)
			continue
		}
		f.Keys[k] = typ
	}
	if t.Stream != "" {
		f.StreamCheckErr = streamCheckErr(ctx, rdb, t.Stream)
	}
	if f.Keys[t.Stream] == "stream" {
		groups, err := rdb.XInfoGroups(ctx, t.Stream).Result()
		if err != nil {
			f.GroupsErr = errText(err)
		}
		for _, g := range groups {
			f.Groups = append(f.Groups, Group{Name: g.Name, Consumers: g.Consumers, Pending: g.Pending, Lag: g.Lag})
		}
	}
	return f
}

// streamCheckErr runs the relay's look at the stream, XINFO STREAM and an
// XRANGE of one entry, and returns the text of the error reply that refused
// either ("" when both answered, a missing stream included). Redis checks an
// ACL before the key, so a refusal shows on a missing stream too.
func streamCheckErr(ctx context.Context, rdb redis.UniversalClient, stream string) string {
	if err := rdb.XInfoStream(ctx, stream).Err(); err != nil && !redisconn.IsNoSuchKey(err) {
		return errText(err)
	}
	if err := rdb.XRangeN(ctx, stream, "-", "+", 1).Err(); err != nil {
		return errText(err)
	}
	return ""
}

// errText is an error's text on one line. Redis errors never hold the
// client's password.
func errText(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func isAuthError(err error) bool {
	s := err.Error()
	return strings.Contains(s, "NOAUTH") || strings.Contains(s, "WRONGPASS") ||
		strings.Contains(s, "invalid username-password")
}

// ParseInfo parses an INFO reply into its fields.
func ParseInfo(raw string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(raw, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// DurabilityChecks are the checks of whether Redis keeps what it
// acknowledged: connection, replication role, eviction, persistence. The
// relay runs them periodically and the operator turns them into the
// condition RedisDurable.
func DurabilityChecks(f RedisFacts) Report {
	conn := ConnectionCheck(f)
	if conn.Status == Fail {
		return Report{conn}
	}
	return Report{conn, RoleCheck(f), EvictionCheck(f), PersistenceCheck(f)}
}

// RedisChecks are the durability checks plus the keys and consumer groups
// of t.
func RedisChecks(f RedisFacts, t RedisTarget) Report {
	r := DurabilityChecks(f)
	if r[0].Status == Fail {
		return r
	}
	r = append(r, ReplicasCheck(f))
	for _, k := range []struct{ name, key string }{{"redis.stream", t.Stream}, {"redis.dead-letter-stream", t.DeadLetterStream}} {
		if k.key != "" {
			r = append(r, KeyTypeCheck(k.name, k.key, f))
		}
	}
	if t.Stream != "" {
		r = append(r, StreamCheckCheck(t.Stream, f), GroupsCheck(t.Stream, f))
	}
	return r
}

// ConnectionCheckName is the name of the check ConnectionCheck makes.
const ConnectionCheckName = "redis.connection"

// ConnectionCheck: PING answered, after authentication.
func ConnectionCheck(f RedisFacts) Check {
	c := Check{Name: ConnectionCheckName}
	switch {
	case f.AuthFailed:
		c.Status, c.Reason = Fail, ReasonAuthFailed
		c.Message = "Redis refused the credentials: " + f.ConnectErr + "."
		c.Fix = "check the user and password in REDIS_URL (redis://user:password@host:port) and the server's ACL (ACL LIST) or requirepass."
	case f.ConnectErr != "":
		c.Status, c.Reason = Fail, ReasonUnreachable
		c.Message = "Redis did not answer PING: " + f.ConnectErr + "."
		c.Fix = "check the host, port, scheme (rediss:// for TLS, with --redis-ca-file for a private CA) and the network path."
	default:
		c.Status, c.Reason = OK, ReasonReachable
		c.Message = "Redis answered PING."
	}
	return c
}

// unknownFix tells how to make a check by hand when CONFIG is denied.
const unknownFix = "run CONFIG GET appendonly, appendfsync, save, maxmemory, maxmemory-policy as an admin user " +
	"(or read them in the provider's console: a managed Redis often renames CONFIG), or grant the relay's user +config|get and +info."

// RoleCheck: the server is a master (a replica refuses writes).
func RoleCheck(f RedisFacts) Check {
	c := Check{Name: "redis.role"}
	switch role := f.Info["role"]; role {
	case "master":
		c.Status, c.Reason, c.Message = OK, ReasonReachable, "the server is a master."
	case "slave":
		c.Status, c.Reason = Fail, ReasonReadOnlyReplica
		c.Message = fmt.Sprintf("the server is a replica of %s:%s: it refuses XADD (READONLY).",
			f.Info["master_host"], f.Info["master_port"])
		c.Fix = "point REDIS_URL at the master, or at the sentinels (redis-sentinel://...?master_name=...) so the relay follows failovers."
	default:
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = "the server's role is unknown: INFO replication was refused (" + f.InfoErr + ")."
		c.Fix = "run INFO replication as an admin user, or grant the relay's user +info."
	}
	return c
}

// EvictionCheck: under a maxmemory, only noeviction keeps the stream: any
// other policy may evict the stream key (or all of it) to make room.
func EvictionCheck(f RedisFacts) Check {
	c := Check{Name: "redis.eviction"}
	maxmem, policy, known := f.Config["maxmemory"], f.Config["maxmemory-policy"], f.Config != nil
	if !known && f.Info != nil {
		maxmem, policy, known = f.Info["maxmemory"], f.Info["maxmemory_policy"], true
	}
	if !known || maxmem == "" || policy == "" {
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = "maxmemory and maxmemory-policy are unknown: " + firstNonEmpty(f.ConfigErr, f.InfoErr, "not reported") + "."
		c.Fix = unknownFix
		return c
	}
	n, err := strconv.ParseInt(maxmem, 10, 64)
	switch {
	case err == nil && n == 0:
		c.Status, c.Reason = OK, ReasonEvictionSafe
		c.Message = "no maxmemory: Redis never evicts (policy " + policy + " applies only under a limit); " +
			"at the host's limit writes fail and the relay retries."
	case policy == "noeviction":
		c.Status, c.Reason = OK, ReasonEvictionSafe
		c.Message = "maxmemory " + maxmem + " with noeviction: when full, XADD fails with OOM and the relay retries; nothing is evicted."
	default:
		c.Status, c.Reason = Fail, ReasonEvictionUnsafe
		c.Message = "maxmemory " + maxmem + " with maxmemory-policy " + policy +
			": when memory is full Redis evicts keys, and the stream (with every event in it) can be one of them."
		c.Fix = "CONFIG SET maxmemory-policy noeviction (and in redis.conf), and bound the stream by trimming instead."
	}
	return c
}

// The values of CONFIG GET appendonly; PersistenceCheck reads INFO's
// aof_enabled (1 or 0) into them when CONFIG is denied.
const (
	appendOnlyYes = "yes"
	appendOnlyNo  = "no"
)

// PersistenceCheck: what a restart of Redis keeps. AOF with fsync always or
// everysec keeps everything (everysec: a crash of the host may lose the
// last second); RDB snapshots alone lose what came after the last one; no
// persistence loses every event on a restart: a failure, because the
// outbox rows are already marked dispatched.
func PersistenceCheck(f RedisFacts) Check {
	c := Check{Name: "redis.persistence"}
	aof, fsync, save := f.Config["appendonly"], f.Config["appendfsync"], f.Config["save"]
	saveKnown := f.Config != nil
	if f.Config == nil && f.Info != nil {
		switch f.Info["aof_enabled"] {
		case "1":
			aof = appendOnlyYes
		case "0":
			aof = appendOnlyNo
		}
	}
	switch {
	case aof == appendOnlyYes && (fsync == "always" || fsync == "everysec"):
		c.Status, c.Reason = OK, ReasonPersistent
		c.Message = "AOF on with appendfsync " + fsync + ": a restart keeps every acknowledged entry"
		if fsync == "everysec" {
			c.Message += " (a crash of the host itself may lose up to the last second)"
		}
		c.Message += "."
	case aof == appendOnlyYes && fsync == "no":
		c.Status, c.Reason = Warn, ReasonFsyncLax
		c.Message = "AOF on with appendfsync no: the OS writes the file when it likes (about 30 s on Linux); " +
			"a crash of the host loses those entries."
		c.Fix = "CONFIG SET appendfsync everysec (or always)."
	case aof == appendOnlyYes:
		c.Status, c.Reason = OK, ReasonPersistent
		c.Message = "AOF on (appendfsync unknown: " + firstNonEmpty(f.ConfigErr, "not reported") + ")."
	case aof == appendOnlyNo && saveKnown && strings.TrimSpace(save) != "":
		c.Status, c.Reason = Warn, ReasonPersistenceWeak
		c.Message = "AOF off, RDB snapshots only (save " + save + "): a restart loses every entry added since the last snapshot."
		c.Fix = "CONFIG SET appendonly yes and appendfsync everysec (and in redis.conf)."
	case aof == appendOnlyNo && saveKnown:
		c.Status, c.Reason = Fail, ReasonPersistenceOff
		c.Message = "no persistence (appendonly no, save \"\"): a restart of Redis loses every entry, " +
			"and their outbox rows are already marked dispatched."
		c.Fix = "CONFIG SET appendonly yes and appendfsync everysec (and in redis.conf); " +
			"until then, `relay replay` can republish a window from the table before cleanup deletes it."
	case aof == appendOnlyNo:
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = "AOF is off and whether RDB snapshots are taken is unknown: " +
			firstNonEmpty(f.ConfigErr, "CONFIG GET save not answered") + "."
		c.Fix = unknownFix
	default:
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = "persistence settings are unknown: " + firstNonEmpty(f.ConfigErr, f.InfoErr, "not reported") + "."
		c.Fix = unknownFix
	}
	return c
}

// ReplicasCheck reports the replicas attached (INFO replication). Replicas
// are asynchronous: a failover may lose the writes a replica had not
// received yet, unless the relay waits for them (WAIT).
func ReplicasCheck(f RedisFacts) Check {
	c := Check{Name: "redis.replicas"}
	if f.Info == nil || f.Info["role"] != "master" {
		c.Status, c.Reason = Info, ReasonCheckUnknown
		c.Message = "replicas unknown (INFO replication not answered by a master)."
		return c
	}
	n, _ := strconv.Atoi(f.Info["connected_slaves"])
	online := 0
	var lines []string
	for i := range n {
		s := f.Info["slave"+strconv.Itoa(i)]
		fields := map[string]string{}
		for _, kv := range strings.Split(s, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				fields[k] = v
			}
		}
		if fields["state"] == "online" {
			online++
		}
		lines = append(lines, fmt.Sprintf("%s:%s %s lag %ss", fields["ip"], fields["port"], fields["state"], fields["lag"]))
	}
	switch {
	case n == 0:
		c.Status, c.Reason = Info, ReasonNoReplica
		c.Message = "no replica attached: the events are as safe as this server's persistence."
	case online < n:
		c.Status, c.Reason = Warn, ReasonReplicasAttached
		c.Message = fmt.Sprintf("%d replicas attached, %d online (%s).", n, online, strings.Join(lines, "; "))
		c.Fix = "look at the replicas that are not online (INFO replication on them)."
	default:
		c.Status, c.Reason = OK, ReasonReplicasAttached
		c.Message = fmt.Sprintf("%d replicas online (%s); replication is asynchronous: "+
			"a failover can lose the last writes unless the relay waits for a replica.",
			n, strings.Join(lines, "; "))
	}
	return c
}

// KeyTypeCheck: the key is a stream, or absent (XADD creates it).
func KeyTypeCheck(name, key string, f RedisFacts) Check {
	c := Check{Name: name}
	if e, ok := f.KeyErrs[key]; ok {
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = fmt.Sprintf("TYPE %s failed: %s.", key, e)
		c.Fix = "grant the relay's user +type on the key, or run TYPE " + key + " as an admin user."
		return c
	}
	switch typ := f.Keys[key]; typ {
	case "stream":
		c.Status, c.Reason, c.Message = OK, ReasonStreamUsable, fmt.Sprintf("%s is a stream.", key)
	case "none", "":
		c.Status, c.Reason, c.Message = OK, ReasonStreamUsable, fmt.Sprintf("%s does not exist yet; the first XADD creates it.", key)
	default:
		c.Status, c.Reason = Fail, ReasonWrongType
		c.Message = fmt.Sprintf("%s is a %s, not a stream: every XADD fails with WRONGTYPE.", key, typ)
		c.Fix = "choose another stream name (--stream, spec.redis.stream), or remove the key if it is a mistake."
	}
	return c
}

// StreamCheckCheck: the relay may look at its stream (XINFO STREAM, XRANGE),
// which is how it finds a stream reset. Refused, a reset goes unnoticed: the
// events Redis lost would be lost silently, so it fails.
func StreamCheckCheck(stream string, f RedisFacts) Check {
	c := Check{Name: "redis.stream-check"}
	if f.StreamCheckErr != "" {
		c.Status, c.Reason = Fail, ReasonStreamCheckRefused
		c.Message = "XINFO STREAM or XRANGE " + stream + " was refused (" + f.StreamCheckErr + "): the relay could not " +
			"see a stream reset, so events Redis lost would not be replayed."
		c.Fix = "grant the relay's user +xinfo|stream and +xrange on " + stream + " (docs/relay.md, ACL users), " +
			"or connect without a proxy that lacks them."
		return c
	}
	c.Status, c.Reason = OK, ReasonStreamUsable
	c.Message = "the relay can look at " + stream + " (XINFO STREAM, XRANGE) to find a stream reset."
	return c
}

// GroupsCheck lists the consumer groups of the stream and their lag.
func GroupsCheck(stream string, f RedisFacts) Check {
	c := Check{Name: "redis.consumer-groups"}
	switch {
	case f.GroupsErr != "":
		c.Status, c.Reason = Warn, ReasonCheckUnknown
		c.Message = "XINFO GROUPS " + stream + " failed: " + f.GroupsErr + "."
		c.Fix = "grant the relay's user +xinfo, or run XINFO GROUPS " + stream + " as an admin user."
	case len(f.Groups) == 0:
		c.Status, c.Reason = Info, ReasonNoConsumerGroup
		c.Message = "no consumer group reads " + stream + " yet."
	default:
		c.Status, c.Reason = OK, ReasonConsumerGroupsSeen
		parts := make([]string, 0, len(f.Groups))
		for _, g := range f.Groups {
			lag := strconv.FormatInt(g.Lag, 10)
			if g.Lag < 0 {
				lag = "unknown"
			}
			parts = append(parts, fmt.Sprintf("%s (%d consumers, lag %s, pending %d)", g.Name, g.Consumers, lag, g.Pending))
		}
		c.Message = "consumer groups of " + stream + ": " + strings.Join(parts, "; ") + "."
	}
	return c
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// Summary is the verdict of the durability checks as one condition: status
// "True" (all ok), "False" (a known risk: a warn or fail), or "Unknown" (a
// check could not be made, or Redis could not be reached), with the reason
// and message of the check that decided it and its fix.
type Summary struct {
	Status  string
	Reason  string
	Message string
}

// Summarize folds durability checks into a Summary: the first failing
// check decides, then the first warning that is a known risk, then the
// first unknown.
func Summarize(r Report) Summary {
	pick := func(match func(Check) bool) (Check, bool) {
		for _, c := range r {
			if match(c) {
				return c, true
			}
		}
		return Check{}, false
	}
	msg := func(c Check) string {
		if c.Fix != "" {
			return c.Message + " Fix: " + c.Fix
		}
		return c.Message
	}
	if c, ok := pick(func(c Check) bool { return c.Name == ConnectionCheckName && c.Status == Fail }); ok {
		return Summary{"Unknown", c.Reason, msg(c)}
	}
	if c, ok := pick(func(c Check) bool { return c.Status == Fail }); ok {
		return Summary{"False", c.Reason, msg(c)}
	}
	if c, ok := pick(func(c Check) bool { return c.Status == Warn && c.Reason != ReasonCheckUnknown }); ok {
		return Summary{"False", c.Reason, msg(c)}
	}
	if c, ok := pick(func(c Check) bool { return c.Status == Warn }); ok {
		return Summary{"Unknown", c.Reason, msg(c)}
	}
	parts := make([]string, 0, len(r))
	for _, c := range r {
		if c.Name != ConnectionCheckName {
			parts = append(parts, c.Message)
		}
	}
	return Summary{"True", ReasonDurable, strings.Join(parts, " ")}
}
