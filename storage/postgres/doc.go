// Package postgres fences writes to PostgreSQL (through pgx v5) with the
// fences a lock hands out, so that a holder whose lease expired while it was
// paused cannot overwrite the work of the holder that came after it.
//
// # The guard table
//
// The migrations package creates fencekit_guard, which keeps one high-water
// mark per resource: the newest fence (token, holder) admitted for it. A
// fence is admitted when its token is above the mark, or equal to it and
// presented by the mark's holder ([fence.Admits]); admission raises the mark
// in the same statement. [Guard] does this as the first statement of the
// caller's transaction, at its top level (it refuses to run inside a
// savepoint, whose rollback would undo it), and leaves the guard row locked
// until the transaction ends, so everything the transaction then reads and
// writes is fenced: no
// older holder can be admitted in between, and newer holders wait for it. A
// refused fence returns an error, prefixed "postgres:" like every error of
// the package, that matches [fence.ErrStale] and wraps a [*fence.StaleError]
// carrying the mark, which a lock uses to heal a counter Redis lost
// ([fence.LostTo] takes it from the error; [HighWater] reads it from the
// table).
//
// Reads that a later write depends on must be fenced as well: guard the read
// transaction too, or an older holder's write can still land between your
// read and your write.
//
// # Ways to use it
//
//   - [InTx] begins a transaction, guards one fence, runs your function and
//     commits, rolling back on any error. It is the usual fenced
//     read-modify-write, and on a pool or a connection BEGIN and the guard
//     share one round trip: the round trips of the same plain transaction.
//   - [GuardAll] guards several resources in one transaction, locking their
//     rows in ascending resource order so two transactions cannot deadlock.
//   - [Exec] sends the guard and your statements as one pipelined batch that
//     commits as one implicit transaction: a fenced write at the round-trip
//     cost of a plain one. A stale guard raises SQLSTATE [CodeStale], which
//     aborts the batch before any statement runs.
//   - [Query] is the matching one-round-trip fenced read: the guard and a
//     SELECT pipelined together, the rows handed to your function.
//   - [Table.Update] and [Table.Upsert] fence single rows of a table that
//     carries its own token and holder columns, and tell a stale fence from a
//     missing row ([fence.ErrNotFound]).
//   - [Table.UpdateVersion] is optimistic locking on a version column,
//     returning a [*fence.ConflictError] when another write came first;
//     [Retry] reruns a read-modify-write on conflicts and on serialization
//     failures.
//   - [Once] runs a key's work at most once: the work and a completion
//     record commit in one fenced transaction, so a job that committed but
//     lost its reply, or crashed after COMMIT, is not run again by the next
//     holder; [LookupOnce] reads the record (which token, the holder's
//     mark, when).
//
// # Guard table or row-level marks
//
// The guard table keeps one row per resource ever guarded, for good:
// fencekit never deletes one, and deleting one lowers that resource's mark to
// zero, which admits every old holder again. Measured on PostgreSQL 15 with
// 200,000 rows of an 18-byte resource and a 32-digit holder, a row takes
// about 150 to 160 bytes with its primary-key index, some 15 GB for 10^8
// resources; raising every mark once more left about 300 bytes per row (30 GB
// for 10^8) until the dead row versions are reused. Each further byte of
// resource name costs about two more, one in the table and one in the index.
// That is fine for a bounded set of resources (jobs, tenants, shards,
// singletons), not for one resource per entity.
//
// For per-entity resources (a lock per order, account or document), keep the
// mark on the entity's own row with [Table]: a bigint token and a text holder
// column add about 45 bytes to a row that exists anyway, and no rows and no
// index. Use the guard table when what a lock protects is not one existing
// row: several rows or tables, rows that may not exist yet, or a transaction
// that must be fenced before it reads anything.
//
// The two kinds of mark do not protect each other. A write fenced through
// the guard table is not checked against a row's own mark, and a
// [Table.Update] or [Table.Upsert] is not checked against the guard table,
// even for the same resource and token: a holder refused by one is still
// admitted by the other. Choose one kind for each piece of data and fence
// every write to it, and every read a write depends on, the same way.
//
// # Isolation levels and retries
//
// The guard is correct at READ COMMITTED, REPEATABLE READ and
// SERIALIZABLE, and for every pair of levels an older and a newer holder
// run at, whether the level comes from TxOptions or from the database's or
// role's default. Every admitted guard writes a new version of the guard
// row, the fence that already holds the mark included. At READ COMMITTED a
// holder that waited for the guard row sees the mark and the writes its
// rival committed. At REPEATABLE READ and SERIALIZABLE the snapshot was
// taken by the guard's own statement, before its wait ended; PostgreSQL
// then aborts the transaction whose guard meets a row version committed
// after that snapshot; such serialization failures (SQLSTATE 40001), like
// deadlocks (40P01), return an error matching [ErrRetryable] that wraps
// the *pgconn.PgError. Run the whole transaction again, for example with
// [Retry].
//
// # When the outcome is unknown
//
// A write either committed, did not, or the client cannot tell: its ctx
// ended, or its connection broke, after the request (a batch with its
// implicit commit, an autocommit statement, a COMMIT) was sent and before
// the reply arrived. Every call that commits its own write ([Exec],
// [Query], [InTx], [Once] and the [Table] methods, on a pool or a
// connection) then returns an error matching [fence.ErrOutcomeUnknown]
// (a [*fence.OutcomeUnknownError]) that still matches ctx.Err() or the
// network error; none reports such a write as not applied. An error without
// it means nothing committed: the call failed before sending anything (an
// argument pgx cannot encode included: pgx encodes them all before it sends
// the statement), or the server replied with an error, which aborts the
// transaction.
//
// Do not simply run the work again: the fence that was admitted once is
// admitted again, and the work would be applied twice. Read, under the same
// fence, what the write would have changed and decide; or run the work
// through [Once], whose completion record makes a second call tell the
// truth. [Retry] never retries such an error. Calls on a pgx.Tx commit
// nothing themselves, so they never return it; your own COMMIT's outcome is
// yours to judge the same way.
//
// # Panics
//
// Code of yours that runs inside a call may panic: the function given to
// [InTx] or [Query], or the Value and Encode methods of the arguments you
// pass. The call then rolls back what it can (InTx's transaction, or its
// savepoint on a pgx.Tx), closes its batch, returns the connection to its
// pool and lets the panic continue with its original value, so a recovered
// panic (net/http recovers handler panics) leaves no guard row locked and no
// connection checked out.
//
// # Observability
//
// Every call that takes a fence is a span (fencekit.postgres.exec, .query,
// .in_tx, .once, .guard, .guard_all, .table_update, .table_upsert), and so
// is .table_update_version, with the fence's resource and token (guard_all's
// as lists, one entry per fence; holder ids never) and the outcome (once's
// also its key and fencekit.once.ran), and
// every refusal counts in fencekit.fence.rejections with storage="postgres"
// and reason stale or conflict. The package's functions take no options, so they use
// the global OpenTelemetry providers; instruments made before an SDK is
// installed forward to it once it is. Until then the calls start no span
// (unless the caller's span records), which would record nothing.
//
// # Handles and names
//
// Functions take the narrowest interface they need: [Querier], [Beginner]
// and [Batcher] are satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx alike;
// isolation levels ([InTx]'s opts) need a pool or a connection. Table and
// column names are only ever quoted with pgx.Identifier.Sanitize and values
// only ever sent as parameters, so any string without a NUL byte is safe as
// a name. Every call refuses bad input (nil contexts and handles, invalid
// fences, resources longer than [fence.MaxResourceLen], empty names, names
// holding NUL bytes, a [Table] whose columns overlap, a NULL row key, bad
// [Once] keys) before sending anything, with an error matching
// [fence.ErrInvalid]. Every call's ctx bounds its statements: a cancelled ctx returns an error
// matching ctx.Err() (and, for a write cut off in flight,
// [fence.ErrOutcomeUnknown]).
//
// The guard table and function, and Once's completion table, are found
// through the connection's search_path, in the schema where the migrations
// were applied; a missing schema returns an error matching
// [ErrNotMigrated]. A missing table or function of your own returns the
// server's error for it, not ErrNotMigrated.
package postgres
