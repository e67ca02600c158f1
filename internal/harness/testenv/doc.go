// Package testenv hands tests real servers: a Redis client, a PostgreSQL
// pool and a MySQL (or MariaDB) *sql.DB, each isolated per test, and private
// redis-server processes for tests that kill, restart, flush or cluster
// Redis.
//
// Servers are found in this order:
//
//  1. FENCEKIT_TEST_REDIS / FENCEKIT_TEST_POSTGRES, as URLs
//     (redis://127.0.0.1:6379/0, postgres://postgres@127.0.0.1:5432/test),
//     and FENCEKIT_TEST_MYSQL, as a go-sql-driver DSN
//     (root@tcp(127.0.0.1:3306)/test);
//  2. the local servers on their default ports, when they answer;
//  3. containers, when a Docker engine answers (DOCKER_HOST or the default
//     socket): the integration module's cmd/testservers starts them with
//     testcontainers-go, which this module does not depend on, and removes
//     them when the test binary exits;
//  4. otherwise the test is skipped with a message that says how to provide a
//     server, or fails when FENCEKIT_REQUIRE_SERVERS=1 (as in CI).
//
// Private redis-server processes need the redis-server binary on PATH (or in
// FENCEKIT_REDIS_SERVER) and follow the same skip-or-fail rule without it.
package testenv
