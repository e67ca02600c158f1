// Package pgsql fences writes to PostgreSQL made through database/sql (pgx's
// stdlib driver, lib/pq, and every ORM or query builder that runs on a
// *sql.Tx: GORM, sqlx, ent, bun, sqlc) with the fences a lock hands out, so
// that a holder whose lease expired while it was paused cannot overwrite the
// work of the holder that came after it.
//
// It is storage/postgres for database/sql, with the shape of storage/mysql:
// the same functions, the same signatures, the same errors. Programs that
// hold a pgx pool use storage/postgres, which can also pipeline a fenced
// write into one round trip; MySQL and MariaDB use storage/mysql.
//
// # The guard table, shared with storage/postgres
//
// The schema is storage/postgres's: apply it with migrations.Up(ctx, db) on
// your *sql.DB (on a MySQL or MariaDB handle, Up and every call of this
// package fail with an error that names the mix-up and the package to use,
// storage/mysql). The guard table fencekit_guard keeps one high-water mark per
// resource, and [Guard] sends the very statement storage/postgres sends, so a
// database guarded through pgx and through database/sql at once keeps one
// mark per resource: a fence admitted by one package refuses older fences in
// the other. [Once] records completions in the same fencekit_once table.
//
// # Ways to use it
//
//   - [InTx] begins a transaction, guards one fence as its first statement,
//     runs your function and commits, rolling back on any error. It is the
//     usual fenced read-modify-write. Your function gets the *sql.Tx: hand it
//     to your ORM. GORM, with or without PrepareStmt: g :=
//     gdb.Session(&gorm.Session{Context: ctx, NewDB: true}), then
//     g.Statement.ConnPool = tx, as GORM's own Begin does (opening a second
//     *gorm.DB on tx fails under PrepareStmt). sqlx: wrap the *sql.Tx in a
//     *sqlx.Tx. The README and examples/pgsqlorm show both, and GORM's own
//     Transaction with Guard.
//   - [Guard] is the same guard inside a transaction you began yourself;
//     make it the transaction's first statement, at its top level: never
//     inside a savepoint (a nested transaction), whose rollback would undo
//     the guard and leave the rest of the transaction unfenced. Guard
//     refuses to run inside one. [GuardAll] guards several
//     resources, locking their rows in one order so two transactions cannot
//     deadlock.
//   - [Table.Update] and [Table.Upsert] fence single rows of a table that
//     carries its own token and holder columns, in one statement, and tell a
//     stale fence from a missing row ([fence.ErrNotFound]).
//     [Table.UpdateVersion] is optimistic locking on a version column.
//   - [Once] runs a key's work at most once; [LookupOnce] reads its record.
//   - [Retry] reruns a read-modify-write on serialization failures,
//     deadlocks ([ErrRetryable]) and version conflicts.
//
// A refused fence returns an error, prefixed "pgsql:" like every error of the
// package, that matches [fence.ErrStale] and wraps a [*fence.StaleError]
// carrying the mark. Reads that a later write depends on must be fenced
// too: guard first, then read.
//
// # Round trips
//
// database/sql sends one statement at a time, so the guard costs one
// statement of its own: [InTx] is BEGIN, the guard, your statements and
// COMMIT, one statement more than the same plain transaction, and a
// [Table] method is one statement, as the plain UPDATE it replaces. Counted
// on the wire (the suite's RoundTrips test): with pgx's stdlib, statement
// cache or simple protocol, a plain transaction of one UPDATE takes 3 round
// trips and InTx 4, an autocommit UPDATE with arguments 1 and Table.Update
// 1. [Guard] in a transaction of yours is one statement too, which also
// checks that it stands outside any savepoint ([GuardAll] one per fence).
// lib/pq sends every statement with arguments as two round trips (parse
// and describe, then bind and execute), the guard's as your own: a plain
// transaction of one UPDATE with arguments takes 4, InTx 6, Table.Update
// 2, as does the plain UPDATE, and Guard 2 more than the plain
// transaction. With binary_parameters=yes in lib/pq's connection string it
// sends each in one (3, 4, 1 and 1): set it. The guard's arguments are
// always sent as arguments, never written into its text. pgx's stdlib
// prepares a statement on a connection's first use of it (one more round
// trip, once). The guard admits in a plain upsert, without calling a
// function; a refused fence costs nothing more: the statement that refuses
// it carries the mark it lost to. Every admitted guard writes one new
// version of the guard row, the fence that holds the mark included (see
// "Isolation levels and retries" for why).
//
// # Isolation levels and retries
//
// The guard is correct at READ COMMITTED, REPEATABLE READ and
// SERIALIZABLE, and for every pair of levels an older and a newer holder
// run at, whether the level comes from TxOptions or from the database's or
// role's default. Every admitted guard writes a new version of the guard
// row, the fence that already holds the mark included. At READ COMMITTED a
// holder that waited for the guard row sees the mark and the writes its
// rival committed, since each later statement takes a new snapshot. At
// REPEATABLE READ and SERIALIZABLE the snapshot was taken by the guard's
// own statement, before its wait ended; PostgreSQL then aborts the
// transaction whose guard meets a row version committed after that
// snapshot (SQLSTATE 40001), which returns an error matching
// [ErrRetryable]. Run the whole transaction again, for example with
// [Retry].
//
// # When the outcome is unknown
//
// A write either committed, did not, or the client cannot tell: its ctx
// ended, or its connection broke, after the COMMIT (or an autocommit write
// of a [Table] method on a *sql.DB) was sent and before the reply arrived.
// [InTx], [Once] and the [Table] methods outside a transaction then return an
// error matching [fence.ErrOutcomeUnknown] that still matches its cause; none
// reports such a write as not applied. The drivers say different things
// when a connection dies with the reply to a COMMIT in flight, none of which
// proves anything: pgx's stdlib "conn closed" (an error pgx marks safe to
// retry) or "unexpected EOF", and driver.ErrBadConn for an autocommit
// statement under the simple protocol; lib/pq driver.ErrBadConn, which it
// also returns for connections it never wrote to. A context that ends
// mid-COMMIT makes pgx's stdlib return the bare context error, as
// database/sql does for a COMMIT it never sent. So only a server's error
// reply of severity ERROR (or the context checked ending before the COMMIT
// is sent) counts as not applied. A write outside a transaction runs on a
// connection taken first, so a connection that cannot be opened is a plain
// error, and database/sql never resends a write whose connection broke. An
// argument that database/sql cannot convert, or that pgx cannot encode,
// fails before the statement is sent: a plain error too. Do not simply run
// the work again: read, or run it through [Once].
//
// # Poolers and prepared statements
//
// Every statement is one parameterised statement, and the package prepares
// nothing itself, so it works with pgx's stdlib statement cache and with
// default_query_exec_mode=simple_protocol or exec (what PgBouncer's
// transaction mode needs), and with lib/pq's unnamed statements.
//
// # Panics, bad input, telemetry
//
// If your function panics, [InTx] and [Once] roll back, return the
// connection to the pool and let the panic continue. Every call refuses bad
// input (nil contexts and handles, invalid fences, resources longer than
// [fence.MaxResourceLen], empty names or names holding NUL bytes, a [Table]
// whose columns overlap, a NULL row key, bad [Once] keys) before sending
// anything, with an error matching [fence.ErrInvalid] that names the call.
// Every call that takes a fence is a span (fencekit.pgsql.in_tx, .once,
// .guard, .guard_all, .table_update, .table_upsert, and
// .table_update_version), and refusals count in fencekit.fence.rejections
// with storage="pgsql". The spans go to the global OpenTelemetry tracer
// provider; until a program installs an SDK there, the calls start none
// (unless the caller's span records), which would record nothing.
//
// # Files
//
// guard.go holds the guard and the mark; tx.go InTx and Retry; table.go the
// row-level marks and versions; once.go Once; errors.go how driver errors
// (pgx's and lib/pq's alike) become this package's. The SQL is shared with
// storage/postgres, the transaction, its commit's classification and the
// checks with storage/mysql, under internal/.
package pgsql
