// Package mysqllock puts the lock of package lock on MySQL or MariaDB
// alone: a [lock.Locker] whose leases and fencing tokens live in the
// database whose storage guard (storage/mysql) admits them, with no Redis
// anywhere.
//
// [New] returns the same *lock.Locker as lock.New, so [lock.Locker.Do],
// Acquire, TryAcquire, AutoRenew, Extend, the election (Campaign, Resign,
// Leader, Observe, Proclaim) and every storage guard work with it
// unchanged. Run migrations.UpMySQL once per database: migration
// 00005_fencekit_lock creates the tables fencekit_lock and
// fencekit_lock_waiter and the procedures below, beside the guard's, and
// 00006_fencekit_lock_grant_until gives grants their deadline.
// MySQL has no notifications, so the election's Observe reads the record
// every 250 ms: a term that begins and ends between two reads may go
// unreported (every term it reports is one the record held, in order).
//
// # Guarantees
//
// Leases are decided on the server's clock (UTC_TIMESTAMP(6) in µs, whatever
// the session's time zone), in the statement that grants, extends or
// releases: an uncontended grant or release is one autocommitted UPDATE of
// the resource's row, whose token comes back in the reply's last-insert-id
// (LAST_INSERT_ID(expr)); anything else (a contended resource, a new one, a
// queue, an extension, the record) is one CALL of a procedure, which runs
// its own transaction on the row it locked FOR UPDATE. Each is one round
// trip. The fast UPDATE that matched nothing costs a second one (the
// procedure then decides): MySQL 8 has no RETURNING and MariaDB none on
// UPDATE, and multiStatements is the DSN's choice, not the lock's. The
// client believes less than the server holds: a lease is counted from
// before its call was sent.
//
// Tokens strictly increase per resource and live in the Redis and
// PostgreSQL locks' token space: each is max(previous token + 1, the
// server's clock in microseconds), below 2^53, so storage whose marks
// those locks raised admits this lock's tokens, and a resource moved from
// one to the other keeps being admitted (do not lock one resource through
// two backends at once). A row is reclaimed only once its retention
// ([lock.WithTokenRetention]) has passed and the clock has passed its
// token, so after the rows are deleted, or the tables restored from an
// older backup, the clock alone issues tokens above every earlier one, as
// long as the server's clock has not gone back.
//
// Every call ends by its context. A statement whose reply was lost (the
// connection broke, or ctx ended with the request sent) may still run: the
// session it went out on is killed (KILL CONNECTION, on another
// connection of the pool) before the statement is sent again or its grant
// released, so a request still on its way can run nothing after that, and
// a grant whose caller gave up stands no longer than that cleanup (a few
// round trips, within 2 s). A cleanup may not reach the server (a link
// down longer than that) while the request is still in the network, so
// every grant also carries a deadline on the server's clock, the caller's
// or 5 s after the send, whichever comes first, mapped onto the server's
// clock from a reading of it: a request the server reaches later grants
// nothing (and is sent again while the caller waits), and a request whose
// session could not be killed is released again once its deadline has
// passed. So a grant whose caller gave up stands at most until its deadline
// plus the release's round trip, if the server's clock does not step back.
// Deadlocks (1213) and lock wait timeouts (1205) are
// tried again inside the lock, never returned as a lost lock. The lock
// holds whatever the server's or the session's isolation level, autocommit
// (a session that does not autocommit takes the procedures, which commit
// themselves), sql_mode (a routine keeps the sql_mode it was created with;
// the statements are written to mean the same under ANSI_QUOTES,
// NO_BACKSLASH_ESCAPES, PIPES_AS_CONCAT and SIMULTANEOUS_ASSIGNMENT),
// innodb_lock_wait_timeout and max_execution_time or max_statement_time
// (lifted for each CALL on MariaDB; MySQL's applies to SELECT only). A CALL
// begins a transaction, which commits one the session left open: do not
// share a *sql.DB whose sessions do not autocommit with work left
// uncommitted outside a transaction.
//
// # Waiting
//
// MySQL has no LISTEN/NOTIFY. Waiters queue in arrival order across
// processes (fencekit_lock_waiter, by AUTO_INCREMENT id); the release that
// frees a lock hands it, in the same transaction, to the first waiter
// whose entry is live. A waiting Locker keeps a doorbell: one connection,
// taken out of db's pool while it has waiters (and 5 s after), that sleeps
// a second at a time (SELECT SLEEP(1)). The hand-over, once committed,
// interrupts that sleep (KILL QUERY of the connection id the waiter's
// entry names), and the doorbell reads which of its waiters were handed a
// lock and tells each its token: the waiter holds the lock without another
// round trip. The doorbell also reads once a second, so a ring that is
// lost (it came between two statements, or the user may not KILL QUERY the
// doorbell's session) delays a hand-over by a second at most. A user may
// interrupt only its own sessions without CONNECTION_ADMIN (SUPER): give
// every process the same database user. With [lock.WithWait] there is no
// doorbell and waiters poll on that strategy.
//
// # MySQL 8 and MariaDB
//
// The same statements run on both (MariaDB 10.6 and later, MySQL 8.0 and
// later); the tests run on MariaDB 10.11. What differs: MariaDB has
// RETURNING on INSERT and DELETE, MySQL none, and neither on UPDATE (so the
// fast path's token comes back through LAST_INSERT_ID); MariaDB's statement
// timeout (max_statement_time) applies to every statement and is lifted
// for each CALL with SET STATEMENT, MySQL's (max_execution_time) to SELECT
// only; SKIP LOCKED, which both have, is not used, since a waiter's place
// must be kept. The clock is UTC_TIMESTAMP(6), constant within a statement
// on both.
//
// A trigger of your own on fencekit_lock (an audit log, say) costs a
// round trip per grant on MariaDB: an UPDATE that fires a trigger reports
// no insert id there, so the fast path cannot read its token back and the
// grant procedure answers each grant, correctly, one call later.
//
// # Durability
//
// The tables are InnoDB: a grant, an extension and a release are commits,
// durable as the server's other commits (with innodb_flush_log_at_trx_commit=1,
// a redo log flush each, which most of an uncontended grant's time is; see
// docs/performance.md). A crash loses no committed lease; a restore from an
// older backup brings back old leases, which end by their expiry on the
// server's clock, and older counters, above which the clock-anchored
// tokens still rise.
//
// # What it does not offer
//
// lock.Owner (re-entrant holds), FenceLock and lock.WithPrefix are refused
// with an error matching fence.ErrInvalid, nothing sent. A database
// without migrations 00005 and 00006 answers every call with an error matching
// [ErrNotMigrated] that names the call and the migration to run.
package mysqllock
