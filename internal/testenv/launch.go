package testenv

import "errors"

// LaunchPostgres starts a dedicated PostgreSQL server outside a test, for
// programs such as the benchmark, with a database "outbox" on it. The
// caller must Close it.
func LaunchPostgres(opts ...PostgresOption) (*PostgresServer, error) {
	s, err := newPostgresServer(opts...)
	if err != nil {
		return nil, err
	}
	if err := execAdmin(s.dsn(pgSuperuser), sqlCreateDatabase, pgDedicatedDatabase); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return &PostgresServer{srv: s}, nil
}

// PostgresOption configures a server of LaunchPostgres.
type PostgresOption func(*pgServer)

// WithPostgresListen makes the server listen on addr as well as on
// 127.0.0.1, and admit clients of cidr that log in with a password, to a
// database or for replication (the local cluster's pods, for the demo);
// loopback stays trusted.
func WithPostgresListen(addr, cidr string) PostgresOption {
	return func(s *pgServer) {
		s.listen = append(s.listen, addr)
		s.clients = cidr
	}
}

// WithPostgresSetting starts the server with one more setting, "name=value"
// as for postgres -c, overriding the defaults of every test server. It is for
// settings that only take effect at start, or that a test wants from the
// first connection on, e.g. WithPostgresSetting("max_slot_wal_keep_size=1MB")
// for a replication slot that the server invalidates soon.
func WithPostgresSetting(setting string) PostgresOption {
	return func(s *pgServer) {
		s.settings = append(s.settings, setting)
	}
}

// Close stops a server started by LaunchPostgres and removes its data.
func (s *PostgresServer) Close() error { return s.srv.close() }

// LaunchRedis starts a dedicated Redis server outside a test. The caller
// must Close it.
func LaunchRedis(opts ...RedisOption) (*RedisServer, error) {
	var cfg redisConfig
	for _, o := range opts {
		o(&cfg)
	}
	s, err := newRedisServer(cfg)
	if err != nil {
		return nil, err
	}
	return &RedisServer{srv: s}, nil
}

// Close stops a server started by LaunchRedis and removes its files.
func (s *RedisServer) Close() error { return s.srv.close() }
