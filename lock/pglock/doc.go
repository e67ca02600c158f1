// Package pglock is the lock of package lock on PostgreSQL alone: leases
// and fencing tokens kept in the database whose storage guards admit
// them, with no Redis anywhere.
//
// Every grant, release and extension is one statement, one round trip,
// decided on the server's clock (clock_timestamp()), never on a client's.
// Tokens strictly increase per resource and share the Redis lock's token
// space: each is max(previous token + 1, the server's clock in
// microseconds), below 2^53, so storage guards that admitted a Redis
// lock's tokens admit this lock's too, and a resource moved from one lock
// to the other keeps being admitted.
//
// Waiting is in arrival order across processes: the release that frees a
// lock hands it to the first live waiter in the same statement and
// notifies it (LISTEN/NOTIFY, on one connection per Locker). Where LISTEN
// cannot work (PgBouncer in transaction mode), waiters poll with backoff.
//
// The tables are UNLOGGED, created by migration 00006_fencekit_lock
// (migrations.UpPool or migrations.Up): a crash or a failover loses the
// leases, as a Redis restart without persistence does, and tokens, anchored
// to the clock, keep increasing; docs/guarantees.md says what holds.
package pglock

// Where things are, for those who work on this package (not part of its
// documentation):
//
//   - backend.go: the core: try, release, extend, the record, reclaim;
//   - wait.go: waiting in the queue; listen.go: the LISTEN connection;
//   - sql.go: the statements, each a call of a function of migration
//     00006; errors.go: translation of server errors.
