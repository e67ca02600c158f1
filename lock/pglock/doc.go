// Package pglock puts the lock of package lock on PostgreSQL alone: a
// [lock.Locker] whose leases and fencing tokens live in the database whose
// storage guards admit them, with no Redis anywhere.
//
// [New] returns the same *lock.Locker as lock.New, so [lock.Locker.Do],
// Acquire, TryAcquire, AutoRenew, the election and every storage guard
// (storage/postgres, storage/pgsql, storage/mysql, storage/redis) work with
// it unchanged:
//
//	if err := migrations.UpPool(ctx, pool); err != nil { // once per database
//		return err
//	}
//	locker, err := pglock.New(pool)
//	if err != nil {
//		return err
//	}
//	defer locker.Close()
//	err = locker.Do(ctx, "invoice:42", 10*time.Second, func(ctx context.Context, f fence.Fence) error {
//		return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `UPDATE invoices SET total = total + 5 WHERE id = 42`)
//			return err
//		})
//	})
//	return err
//
// # Guarantees
//
// Every grant, release and extension is one statement, one round trip, and
// the server decides in that statement when a lease ends, on its own clock
// (clock_timestamp()), never on a client's. A grant whose reply was lost
// and that is tried again with the same holder id returns the same grant;
// a grant whose caller gave up while it was in flight is released, so no
// lock is left that nobody knows about.
//
// A grant whose caller gave up, or that a retry answered in its place,
// never stands past a bound: every grant is sent with a deadline on the
// server's clock (the caller's context deadline, or 5 seconds after the
// send when that is sooner or there is none), mapped from the client's
// monotonic clock through a reading of the server's clock_timestamp()
// (taken again every 30 seconds, with 0.1 % allowed for the two clocks'
// rates), and the server refuses the grant past it with nothing changed.
// Once the deadline has passed, a caller that gave up voids whatever the
// request may have granted (migration 00012_fencekit_lock_grant_until). So
// a request held in the network and delivered late either finds its
// deadline passed (a TryAcquire that gave up at its deadline leaves
// nothing), or lands before it and is voided by it: it stands at most
// until the grant's deadline, 5 seconds after its send at most, plus one
// round trip. This assumes the server's clock does not step back; a
// server that reaches a grant past its deadline while its caller still
// waits answers "too late", and the grant is sent again. A statement whose session broke
// before its answer came back (pg_terminate_backend, a restart, a pooled
// connection that died while idle) is sent again on another connection,
// as go-redis retries the Redis lock's scripts: every statement answers a
// repeat of a run that happened as that run did.
//
// Tokens strictly increase per resource and live in the Redis lock's token
// space: each is max(previous token + 1, the server's clock in
// microseconds), below 2^53. So storage whose marks a Redis lock raised
// (about 1.8e15) admits this lock's tokens, and a resource moved from one
// lock to the other keeps being admitted; do not lock one resource through
// both at once. The row of an idle resource is deleted once its retention
// ([lock.WithTokenRetention], 10 minutes by default) has passed and the
// clock has passed its token, so the table holds only active resources and
// the clock carries the order once a row is gone.
//
// Waiting ([lock.Locker.Acquire]) is in arrival order across processes:
// the release that frees a lock hands it, in the same statement, to the
// first waiter whose entry is live, and a NOTIFY tells that waiter its
// token, so it holds the lock without another round trip. Each Locker
// listens on one connection of its own, outside the pool, opened as the
// pool opens its own (its ConnConfig, BeforeConnect and AfterConnect); a
// failure to connect is logged (slog's default logger, a warning at most
// every 30 seconds) and counted (the fencekit.pglock.listener.failures
// counter), and waiters poll meanwhile. The listener pings its connection
// after 2 seconds without traffic and replaces it when the ping gets no
// answer within 2 seconds: a connection gone silent without FIN or RST is
// replaced within 4 seconds and a connect. The replacement ends the silent
// session on the server (pg_terminate_backend, which needs the same role
// or pg_signal_backend), so it no longer pins the database's NOTIFY queue;
// without that right, the keepalives and the TCP user timeout the listener
// sets on its session (about 20 seconds) end it. The listener's session
// also sets idle_session_timeout to 0, so a database's idle timeout does
// not end it between notifications. A waiter that gives up leaves the queue in one round
// trip; one that vanished is handed the lock at most once, which costs the
// waiters behind it that lease, as on Redis. Where LISTEN cannot work
// (PgBouncer in transaction mode, which does not keep a session's LISTEN),
// give [lock.WithWait]: the Locker opens no LISTEN connection and its
// waiters poll on that strategy, in no particular order.
//
// The record beside each lock (the election's leader) is written only by
// the grant that holds the lock, only goes up in token, and every write is
// announced with a NOTIFY to its watchers.
//
// # Durability
//
// The tables are UNLOGGED: a grant or a release writes no WAL and waits for
// no disk, three times the pairs per second of a logged table on the same
// server (docs/performance.md). A crash of the server (or an immediate
// shutdown) empties them, and a standby has none of their rows: after a
// crash or a failover every lease is gone, as after a Redis restart without
// persistence, and a second holder can be granted while the first still
// works. The clock-anchored tokens keep storage safe then: the new grant's
// token, from the clock, is above every earlier one as long as the server's
// clock (the promoted standby's, after a failover) has not gone back past
// them, and storage refuses the older holder's writes. docs/guarantees.md
// in the repository says what holds after a crash and a failover.
//
// # What it does not offer
//
// [lock.Owner] (re-entrant holds), [lock.Locker.FenceLock] and
// [lock.WithPrefix] are Redis's, and are refused with an error matching
// [lock.ErrUnsupported] (and [fence.ErrInvalid]), with nothing sent;
// [lock.Locker.As] has no [lock.RedisNames] to give.
// Calls on a database without migration 00006_fencekit_lock return an
// error matching [ErrNotMigrated] that names the call and the migration.
// Migrations 00007_fencekit_lock_fast_path and 00008_fencekit_lock_grant,
// which migrations.UpPool applies with it, make an uncontended grant and
// release one plain UPDATE each, sent with the function of the full path
// in the same statement (on a pool that keeps no statements prepared, such
// as one sending the simple protocol, the lock calls the functions
// instead, whose statements stay planned in the session); a database that has only 00006 or 00007 gets the
// same answers, more slowly (grants and releases there take the older
// functions; the newer statements are tried again once a minute, and the
// first grant that finds them missing takes a second round trip). A
// database without 00012_fencekit_lock_grant_until takes the older
// functions too, whose grants carry no deadline: a late grant there
// stands for its lease.
package pglock

// Where things are, for those who work on this package (not part of its
// documentation):
//
//   - pglock.go: New;
//   - contract.go: the lock's backend contract (internal/lockbackend) on
//     top of the core: Try, Extend, Release, the queue's waiters, the
//     record;
//   - backend.go: the core: one statement per call, reclaim;
//   - listen.go: the LISTEN connection and its notifications;
//   - sql.go: the statements: the uncontended grant and release as plain
//     SQL (an UPDATE, and the full path's function in the same statement
//     when it matched nothing), every other call a function of migration
//     00006 (migrations/00006_fencekit_lock.sql, where the protocol is
//     written down; 00007 adds the queue flag and the full paths'
//     functions, 00008 the grant's full path answering in one array);
//     errors.go: translation of server errors.
