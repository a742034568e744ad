// Package redisconn turns the relay's REDIS_URL into a go-redis client for
// every kind of Redis deployment the project supports:
//
//	redis://[user:password@]host:port[/db]            one server
//	rediss://[user:password@]host:port[/db]           one server over TLS
//	unix://[user:password@]/path/to/socket[?db=N]     one server on a Unix socket
//	redis-sentinel://[user:password@]host:port[/db]?master_name=NAME[&addr=host:port...]
//	                                                  Redis Sentinel: the sentinels' addresses, the master's name
//	rediss-sentinel://...                             the same over TLS (sentinels and data nodes)
//	redis-cluster://[user:password@]host:port[?addr=host:port...]
//	                                                  Redis Cluster: one or more seed nodes
//	rediss-cluster://...                              the same over TLS
//
// The user and password of the URL authenticate to the data nodes (an ACL
// user, or only a password for requirepass). Sentinels that require their
// own credentials take them from the query parameters sentinel_username and
// sentinel_password. A CA file (the relay's --redis-ca-file) verifies the
// server certificates of a TLS URL instead of the system's roots.
//
// Parse errors never quote the URL: it holds a password.
package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/netdial"
)

// Kind is the shape of a Redis deployment.
type Kind string

// The kinds of deployment a URL can name.
const (
	Single   Kind = "single"
	Sentinel Kind = "sentinel"
	Cluster  Kind = "cluster"
)

// The URL schemes of each kind; the rediss ones are TLS.
const (
	schemeRedis       = "redis"
	schemeRedisTLS    = "rediss"
	schemeUnix        = "unix"
	schemeSentinel    = "redis-sentinel"
	schemeSentinelTLS = "rediss-sentinel"
	schemeCluster     = "redis-cluster"
	schemeClusterTLS  = "rediss-cluster"
)

// Schemes are the URL schemes Parse accepts.
var Schemes = []string{schemeRedis, schemeRedisTLS, schemeUnix, schemeSentinel, schemeSentinelTLS, schemeCluster, schemeClusterTLS}

// Target is a parsed URL.
type Target struct {
	Kind Kind
	// TLS is true for the rediss schemes.
	TLS bool
	// Addrs are the server (Single), the sentinels (Sentinel) or the seed
	// nodes (Cluster), host:port; a socket path for unix://.
	Addrs []string
	// MasterName is the name the sentinels know the master by.
	MasterName string

	single   *redis.Options
	sentinel *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// errInvalid is returned without detail: go-redis and net/url errors may
// quote the URL.
func errInvalid(why string) error {
	return fmt.Errorf("not a valid Redis URL: %s (accepted schemes: %s)", why, strings.Join(Schemes, ", "))
}

// Valid reports whether s parses.
func Valid(s string) bool {
	_, err := Parse(s)
	return err == nil
}

// Parse parses a Redis URL of one of Schemes. The error never holds the URL.
func Parse(raw string) (*Target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errInvalid("it does not parse as a URL")
	}
	switch u.Scheme {
	case schemeRedis, schemeRedisTLS, schemeUnix:
		if u.Scheme == schemeUnix && u.Path == "" || u.Scheme != schemeUnix && u.Host == "" {
			return nil, errInvalid("no host (or socket path)")
		}
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, errInvalid("go-redis refused it (check the host, port, database number and query parameters)")
		}
		return &Target{Kind: Single, TLS: u.Scheme == schemeRedisTLS, Addrs: []string{o.Addr}, single: o}, nil
	case schemeSentinel, schemeSentinelTLS:
		return parseSentinel(u)
	case schemeCluster, schemeClusterTLS:
		plain := *u
		plain.Scheme = strings.TrimSuffix(u.Scheme, "-cluster")
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, errInvalid("go-redis refused the cluster URL (check the hosts, ports and query parameters)")
		}
		return &Target{Kind: Cluster, TLS: plain.Scheme == schemeRedisTLS, Addrs: o.Addrs, cluster: o}, nil
	case "":
		return nil, errInvalid("no scheme")
	}
	return nil, errInvalid("unknown scheme " + strconv.Quote(u.Scheme))
}

// parseSentinel reads redis-sentinel://[user:pw@]host:port[/db]?master_name=x&addr=h:p.
func parseSentinel(u *url.URL) (*Target, error) {
	o := &redis.FailoverOptions{}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	if u.Host == "" {
		return nil, errInvalid("no sentinel host")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "26379"
	}
	o.SentinelAddrs = []string{net.JoinHostPort(host, port)}
	switch p := strings.Trim(u.Path, "/"); {
	case p == "":
	case !strings.Contains(p, "/"):
		db, err := strconv.Atoi(p)
		if err != nil || db < 0 {
			return nil, errInvalid("the path must be a database number")
		}
		o.DB = db
	default:
		return nil, errInvalid("the path must be a database number")
	}
	q := u.Query()
	for k, vs := range q {
		switch k {
		case "master_name":
			o.MasterName = vs[len(vs)-1]
		case "addr":
			for _, a := range vs {
				h, p, err := net.SplitHostPort(a)
				if err != nil || h == "" || p == "" {
					return nil, errInvalid("an addr parameter is not host:port")
				}
				o.SentinelAddrs = append(o.SentinelAddrs, a)
			}
		case "sentinel_username":
			o.SentinelUsername = vs[len(vs)-1]
		case "sentinel_password":
			o.SentinelPassword = vs[len(vs)-1]
		default:
			// Not named: a password with an unencoded '&' splits into
			// parameters named by its parts.
			return nil, errInvalid("an unknown query parameter (a sentinel URL takes master_name, addr, " +
				"sentinel_username, sentinel_password; percent-encode '&', '=', '#' and '+' in a value)")
		}
	}
	if o.MasterName == "" {
		return nil, errInvalid("a sentinel URL needs ?master_name=<the master's name>")
	}
	return &Target{Kind: Sentinel, TLS: u.Scheme == schemeSentinelTLS, Addrs: o.SentinelAddrs,
		MasterName: o.MasterName, sentinel: o}, nil
}

// Options shape the client. Zero fields keep go-redis's defaults, except
// MaxRetries (see there).
type Options struct {
	// CAFile is a PEM file of CA certificates that verify the servers of a
	// TLS URL (instead of the system's roots). Refused for a plain URL.
	CAFile string
	// CA is the same as PEM bytes (the operator reads it from a Secret).
	CA []byte
	// DialTimeout, ReadTimeout and WriteTimeout bound each connection.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// PoolSize is the connections per node.
	PoolSize int
	// TCP are the socket settings of every connection.
	TCP netdial.TCP
	// Retries lets go-redis retry a failed command on its own. Off by
	// default: a retried pipeline would add entries twice.
	Retries bool
}

// TLSConfig builds the TLS settings of a TLS target: TLS 1.2 at least, the
// server name taken from each address dialled, the CA of o when given.
func (o Options) TLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	pem := o.CA
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the Redis CA file: %w", err)
		}
		pem = b
	}
	if o.CAFile != "" || len(pem) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("the Redis CA holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// dialer returns the dial function of every connection: TCP with o.TCP's
// socket settings, wrapped in TLS for a TLS target. The TLS server name is
// the host of each address, so one setting fits sentinels, masters and
// cluster nodes alike.
func (o Options) dialer(t *Target) (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	nd := o.TCP.Dialer(o.DialTimeout)
	if !t.TLS {
		return nd.DialContext, nil
	}
	cfg, err := o.TLSConfig()
	if err != nil {
		return nil, err
	}
	td := &tls.Dialer{NetDialer: nd, Config: cfg}
	return td.DialContext, nil
}

// Client returns a client for the target: a *redis.Client (one server, or
// the master a sentinel set names, followed across failovers) or a
// *redis.ClusterClient. The caller closes it.
func (t *Target) Client(o Options) (redis.UniversalClient, error) {
	if !t.TLS && (o.CAFile != "" || len(o.CA) > 0) {
		return nil, errors.New("a Redis CA was given but the URL is not a TLS one (rediss://, rediss-sentinel:// or rediss-cluster://)")
	}
	dial, err := o.dialer(t)
	if err != nil {
		return nil, err
	}
	maxRetries := -1
	if o.Retries {
		maxRetries = 0 // go-redis's default
	}
	var tlsCfg *tls.Config
	if t.TLS {
		// Kept for go-redis's own decisions (it knows the link is TLS); the
		// dialer above does the handshake.
		if tlsCfg, err = o.TLSConfig(); err != nil {
			return nil, err
		}
	}
	switch t.Kind {
	case Sentinel:
		fo := *t.sentinel
		fo.SentinelAddrs = append([]string(nil), fo.SentinelAddrs...)
		fo.Dialer, fo.TLSConfig = dial, tlsCfg
		fo.MaxRetries = maxRetries
		fo.ContextTimeoutEnabled = true
		o.apply(&fo.DialTimeout, &fo.ReadTimeout, &fo.WriteTimeout, &fo.PoolSize)
		return redis.NewFailoverClient(&fo), nil
	case Cluster:
		co := *t.cluster
		co.Addrs = append([]string(nil), co.Addrs...)
		co.Dialer, co.TLSConfig = dial, tlsCfg
		co.MaxRetries = maxRetries
		co.ContextTimeoutEnabled = true
		o.apply(&co.DialTimeout, &co.ReadTimeout, &co.WriteTimeout, &co.PoolSize)
		return redis.NewClusterClient(&co), nil
	}
	so := *t.single
	so.Dialer, so.TLSConfig = dial, tlsCfg
	so.MaxRetries = maxRetries
	so.ContextTimeoutEnabled = true
	o.apply(&so.DialTimeout, &so.ReadTimeout, &so.WriteTimeout, &so.PoolSize)
	return redis.NewClient(&so), nil
}

// apply sets the timeouts and pool size that o sets, keeping the URL's
// (or go-redis's defaults) for the others.
func (o Options) apply(dial, read, write *time.Duration, pool *int) {
	for _, x := range []struct {
		dst *time.Duration
		v   time.Duration
	}{{dial, o.DialTimeout}, {read, o.ReadTimeout}, {write, o.WriteTimeout}} {
		if x.v != 0 {
			*x.dst = x.v
		}
	}
	if o.PoolSize != 0 {
		*pool = o.PoolSize
	}
}

// New parses raw and returns its client: Parse, then Client.
func New(raw string, o Options) (redis.UniversalClient, *Target, error) {
	t, err := Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	c, err := t.Client(o)
	if err != nil {
		return nil, nil, err
	}
	return c, t, nil
}

// IsNoSuchKey reports the error XINFO STREAM answers for a stream that
// does not exist: an answer, not a failure.
func IsNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// NodeFor returns the client of the node that holds key: the master of
// the key's slot in a cluster, rdb itself otherwise. Server-level commands
// (CONFIG, INFO) sent through it describe the server that keeps the key.
func NodeFor(ctx context.Context, rdb redis.UniversalClient, key string) (redis.UniversalClient, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb, nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("finding the cluster node of %q: %w", key, err)
	}
	return node, nil
}
