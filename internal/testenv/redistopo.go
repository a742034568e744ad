package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithRedisArgs passes more config directives to redis-server, e.g.
// WithRedisArgs("--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru")
// or an ACL user: WithRedisArgs("--user", "relay", "on", ">pw", "~jobs*", "+xadd").
func WithRedisArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.extraArgs = append(c.extraArgs, args...) }
}

// TLSFiles are the PEM files of a TLS server (see [NewTestCA]).
type TLSFiles struct {
	// CAFile holds the CA certificate that signed CertFile.
	CAFile, CertFile, KeyFile string
}

// WithTLS makes the server accept TLS connections only (its plain port is
// off), with the given certificate; clients are not asked for one. Its URL
// is rediss://.
func WithTLS(files TLSFiles) RedisOption {
	return func(c *redisConfig) { c.tls = &files }
}

// portArgs are the listening flags: the plain port, or only the TLS port.
func (s *redisServer) portArgs() []string {
	if s.cfg.tls == nil {
		return []string{"--port", strconv.Itoa(s.port)}
	}
	return []string{"--port", "0", "--tls-port", strconv.Itoa(s.port),
		"--tls-cert-file", s.cfg.tls.CertFile, "--tls-key-file", s.cfg.tls.KeyFile,
		"--tls-ca-cert-file", s.cfg.tls.CAFile, "--tls-auth-clients", "no"}
}

// Addr is 127.0.0.1:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port()) }

// Port is the server's port (the TLS port under [WithTLS]).
func (s *RedisServer) Port() int {
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	return s.srv.port
}

// Kill sends SIGKILL to the server's pid and waits for it to exit: a crash,
// which keeps only what its persistence had written. Start brings it back.
func (s *RedisServer) Kill(t testing.TB) {
	t.Helper()
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	if p := s.srv.proc; p != nil {
		s.srv.proc = nil
		_ = p.stop(syscall.SIGKILL, redisStopTimeout)
	}
}

// Freeze sends SIGSTOP to the server: it keeps its connections open but
// answers nothing, and as a replica acknowledges nothing, until Thaw (or the
// test's cleanup, which stops it either way).
func (s *RedisServer) Freeze(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Thaw sends SIGCONT to a server that Freeze stopped.
func (s *RedisServer) Thaw(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *RedisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	if s.srv.proc == nil {
		t.Fatalf("testenv: signal %v: the server is not running", sig)
	}
	if err := s.srv.proc.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("testenv: signal %v to pid %d: %v", sig, s.srv.proc.pid(), err)
	}
}

// NewTestCA writes a throwaway CA and a server certificate for 127.0.0.1,
// ::1 and localhost, signed by it, into a temp dir of the test (removed at
// its end).
func NewTestCA(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	files := TLSFiles{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	for path, block := range map[string]*pem.Block{
		files.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
		files.CertFile: {Type: "CERTIFICATE", Bytes: der},
		files.KeyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// topologyTimeout bounds how long a sentinel set or a cluster may take to
// settle after its servers started.
const topologyTimeout = 60 * time.Second

// SentinelSet is a master, one replica and three sentinels (quorum 2) on
// loopback, each a redis-server process of the test, stopped by pid at its
// end.
type SentinelSet struct {
	MasterName string
	// Master and Replica are the data servers as started; after a failover
	// their roles are swapped.
	Master, Replica *RedisServer
	Sentinels       []*RedisServer
}

// StartSentinelSet starts the set and returns once the replica is in sync
// and every sentinel knows the replica and the other sentinels. opts apply
// to the master and the replica (e.g. [WithAppendOnly]).
func StartSentinelSet(t testing.TB, opts ...RedisOption) *SentinelSet {
	t.Helper()
	set := &SentinelSet{MasterName: "outbox-test"}
	set.Master = StartRedis(t, opts...)
	set.Replica = StartRedis(t, append(append([]RedisOption(nil), opts...),
		WithRedisArgs("--replicaof", "127.0.0.1", strconv.Itoa(set.Master.Port())))...)
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 10000\n"+
		"sentinel parallel-syncs %[1]s 1\n", set.MasterName, set.Master.Port())
	for range 3 {
		set.Sentinels = append(set.Sentinels, StartRedis(t, func(c *redisConfig) { c.sentinelConf = conf }))
	}
	set.waitSettled(t, set.Master.Addr())
	return set
}

// URL is redis-sentinel://127.0.0.1:<s1>/0?master_name=...&addr=<s2>&addr=<s3>.
func (s *SentinelSet) URL() string {
	q := url.Values{"master_name": {s.MasterName}}
	for _, sn := range s.Sentinels[1:] {
		q.Add("addr", sn.Addr())
	}
	return "redis-sentinel://" + s.Sentinels[0].Addr() + "/0?" + q.Encode()
}

// MasterAddr is the master's address as the first sentinel reports it.
func (s *SentinelSet) MasterAddr(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr()})
	defer func() { _ = c.Close() }()
	hp, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		t.Fatalf("testenv: asking the sentinel for the master: %v", err)
	}
	return net.JoinHostPort(hp[0], hp[1])
}

// Failover asks a sentinel to fail over (SENTINEL FAILOVER) and returns once
// the replica is the master, the sentinels agree, and the old master
// replicates from it.
func (s *SentinelSet) Failover(t testing.TB) {
	t.Helper()
	old := s.MasterAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr()})
	defer func() { _ = c.Close() }()
	if err := c.Failover(ctx, s.MasterName).Err(); err != nil {
		t.Fatalf("testenv: SENTINEL FAILOVER: %v", err)
	}
	next := s.Replica
	if old == s.Replica.Addr() {
		next = s.Master
	}
	s.waitSettled(t, next.Addr())
}

// waitSettled waits until every sentinel names master, master has one
// replica online, and every sentinel sees that replica and two other
// sentinels.
func (s *SentinelSet) waitSettled(t testing.TB, master string) {
	t.Helper()
	deadline := time.Now().Add(topologyTimeout)
	var why string
	for time.Now().Before(deadline) {
		if why = s.settled(master); why == "" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("testenv: sentinel set not settled after %s: %s", topologyTimeout, why)
}

func (s *SentinelSet) settled(master string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m := redis.NewClient(&redis.Options{Addr: master, MaxRetries: -1})
	defer func() { _ = m.Close() }()
	info, err := m.Info(ctx, "replication").Result()
	if err != nil {
		return "master: " + err.Error()
	}
	if !strings.Contains(info, "role:master") || !strings.Contains(info, "connected_slaves:1") ||
		!strings.Contains(info, "state=online") {
		return "master " + master + " has no replica online yet"
	}
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		hp, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		replicas, err2 := c.Replicas(ctx, s.MasterName).Result()
		sentinels, err3 := c.Sentinels(ctx, s.MasterName).Result()
		_ = c.Close()
		switch {
		case err != nil || err2 != nil || err3 != nil:
			return fmt.Sprintf("sentinel %s: %v %v %v", sn.Addr(), err, err2, err3)
		case net.JoinHostPort(hp[0], hp[1]) != master:
			return fmt.Sprintf("sentinel %s names master %s:%s", sn.Addr(), hp[0], hp[1])
		case len(replicas) != 1 || len(sentinels) != 2:
			return fmt.Sprintf("sentinel %s knows %d replicas and %d other sentinels", sn.Addr(), len(replicas), len(sentinels))
		}
		for _, r := range replicas {
			if strings.Contains(r["flags"], "down") || strings.Contains(r["flags"], "disconnected") {
				return fmt.Sprintf("sentinel %s sees replica flags %s", sn.Addr(), r["flags"])
			}
		}
	}
	return ""
}

// RedisCluster is a Redis Cluster on loopback, each node a redis-server
// process of the test, with the 16384 slots split evenly between the
// masters.
type RedisCluster struct {
	// Nodes are the masters as started, Nodes[i] holding the i-th part of
	// the slots.
	Nodes []*RedisServer
	// Replicas[i] are the replicas of Nodes[i] (none from
	// StartRedisCluster).
	Replicas [][]*RedisServer
}

// StartRedisCluster starts masters (at least 3) cluster nodes, assigns the
// slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET) and returns once
// every node reports cluster_state:ok.
func StartRedisCluster(t testing.TB, masters int, opts ...RedisOption) *RedisCluster {
	t.Helper()
	return StartRedisClusterWithReplicas(t, masters, 0, opts...)
}

// StartRedisClusterWithReplicas starts a cluster as [StartRedisCluster]
// does, plus replicas nodes per master (CLUSTER REPLICATE), and returns once
// every node reports cluster_state:ok and every master has its replicas
// online. opts apply to every node.
func StartRedisClusterWithReplicas(t testing.TB, masters, replicas int, opts ...RedisOption) *RedisCluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("testenv: a Redis Cluster needs at least 3 masters, not %d", masters)
	}
	c := &RedisCluster{Replicas: make([][]*RedisServer, masters)}
	startNode := func() (*RedisServer, int) {
		busPort, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		return StartRedis(t, append(append([]RedisOption(nil), opts...), WithRedisArgs(
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(busPort), "--cluster-node-timeout", "2000"))...), busPort
	}
	busPorts := make([]int, masters)
	for i := range masters {
		var n *RedisServer
		n, busPorts[i] = startNode()
		c.Nodes = append(c.Nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	const slots = 16384
	ids := make([]string, masters)
	for i, n := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		first, last := i*slots/masters, (i+1)*slots/masters-1
		err := rc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err()
		if err == nil {
			err = rc.ClusterAddSlotsRange(ctx, first, last).Err()
		}
		if err == nil && i > 0 {
			err = rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", c.Nodes[0].Port(), busPorts[0]).Err()
		}
		if err == nil {
			ids[i], err = rc.Do(ctx, "CLUSTER", "MYID").Text()
		}
		_ = rc.Close()
		if err != nil {
			t.Fatalf("testenv: setting up cluster node %s: %v", n.Addr(), err)
		}
	}
	for i := range masters {
		for range replicas {
			n, _ := startNode()
			c.Replicas[i] = append(c.Replicas[i], n)
			if err := c.replicate(ctx, n, ids[i], busPorts[0]); err != nil {
				t.Fatalf("testenv: making %s a replica of %s: %v", n.Addr(), c.Nodes[i].Addr(), err)
			}
		}
	}
	var why string
	for ctx.Err() == nil {
		if why = c.state(ctx, masters*(1+replicas), replicas); why == "" {
			return c
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("testenv: cluster not ok after %s: %s", topologyTimeout, why)
	return nil
}

// replicate joins n to the cluster and makes it a replica of the master
// with node id master, once n has learnt of that master.
func (c *RedisCluster) replicate(ctx context.Context, n *RedisServer, master string, busPort int) error {
	rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer func() { _ = rc.Close() }()
	if err := rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", c.Nodes[0].Port(), busPort).Err(); err != nil {
		return err
	}
	for {
		err := rc.Do(ctx, "CLUSTER", "REPLICATE", master).Err()
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "Unknown node") {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// state is "" once every node reports cluster_state:ok and knows all nodes,
// and every master has replicas replicas online; else what is missing.
func (c *RedisCluster) state(ctx context.Context, nodes, replicas int) string {
	all := append([]*RedisServer(nil), c.Nodes...)
	for _, rs := range c.Replicas {
		all = append(all, rs...)
	}
	for _, n := range all {
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		info, err := rc.ClusterInfo(ctx).Result()
		_ = rc.Close()
		if err != nil {
			return err.Error()
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(nodes)) {
			return n.Addr() + ": " + strings.Join(strings.Fields(info)[:3], " ")
		}
	}
	for _, n := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		info, err := rc.Info(ctx, "replication").Result()
		_ = rc.Close()
		if err != nil {
			return err.Error()
		}
		if strings.Count(info, "state=online") != replicas {
			return fmt.Sprintf("master %s: not %d replicas online", n.Addr(), replicas)
		}
	}
	return ""
}

// MasterOf returns the index in Nodes of the master that holds key's slot
// as the slots were assigned (CLUSTER KEYSLOT; no failover since).
func (c *RedisCluster) MasterOf(t testing.TB, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr(), MaxRetries: -1})
	defer func() { _ = rc.Close() }()
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("testenv: CLUSTER KEYSLOT %s: %v", key, err)
	}
	const slots = 16384
	for i := range c.Nodes {
		if int(slot) <= (i+1)*slots/len(c.Nodes)-1 {
			return i
		}
	}
	return len(c.Nodes) - 1
}

// URL is redis-cluster://127.0.0.1:<n1>?addr=<n2>&addr=<n3>....
func (c *RedisCluster) URL() string {
	q := url.Values{}
	for _, n := range c.Nodes[1:] {
		q.Add("addr", n.Addr())
	}
	return "redis-cluster://" + c.Nodes[0].Addr() + "?" + q.Encode()
}
