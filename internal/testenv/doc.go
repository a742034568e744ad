// Package testenv gives tests real PostgreSQL and Redis servers on this machine,
// without Docker.
//
// Servers are throwaway processes: PostgreSQL is initialised with initdb into a temp
// dir and run with trust auth on 127.0.0.1 (as the "postgres" user when the tests
// run as root, because initdb refuses root); Redis runs without persistence unless a
// test asks for it. Every server listens on a loopback port chosen free at run time,
// writes its log to a file in its temp dir (the tail of which is quoted when it does
// not come up), and is stopped by its pid: shared servers by [Main] after the tests,
// dedicated ones in t.Cleanup. Temp dirs are removed with them.
//
// Use it from a package's tests:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	func TestRelayDrains(t *testing.T) {
//		t.Parallel()
//		dsn := testenv.Postgres(t)  // a new, empty database for this test
//		url := testenv.Redis(t)     // a shared Redis server
//		stream := testenv.Name(t)   // a stream name no other test uses
//		...
//	}
//
// [Postgres] and [Redis] share one server per test binary, started on first use;
// [StartPostgres] and [StartRedis] start a dedicated server that a fault test may
// stop and start again. OUTBOX_TEST_DATABASE_URL and OUTBOX_TEST_REDIS_URL point the
// shared helpers at existing servers instead.
//
// When a server binary is missing, the test is skipped with a message saying how
// to install it (hack/install-test-deps.sh); with CI=true it fails instead.
package testenv
