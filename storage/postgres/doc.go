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
// caller's transaction and leaves the guard row locked until the transaction
// ends, so everything the transaction then reads and writes is fenced: no
// older holder can be admitted in between, and newer holders wait for it. A
// refused fence returns a [*fence.StaleError] that carries the mark, which a
// lock uses to heal a counter Redis lost ([HighWater] reads it directly).
//
// Reads that a later write depends on must be fenced as well: guard the read
// transaction too, or an older holder's write can still land between your
// read and your write.
//
// # Ways to use it
//
//   - [InTx] begins a transaction, guards one fence, runs your function and
//     commits, rolling back on any error. It is the usual fenced
//     read-modify-write.
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
//
// # Isolation levels and retries
//
// The guard is correct at READ COMMITTED, where a holder that waited for the
// guard row sees the mark its rival committed. At REPEATABLE READ and
// SERIALIZABLE, PostgreSQL instead aborts a transaction whose guard row was
// raised after its snapshot; such serialization failures (SQLSTATE 40001),
// like deadlocks (40P01), return an error matching [ErrRetryable] that wraps
// the *pgconn.PgError. Run the whole transaction again, for example with
// [Retry].
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
// # Handles and names
//
// Functions take the narrowest interface they need: [Querier], [Beginner]
// and [Batcher] are satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx alike;
// [TxBeginner] (for isolation levels) by pools and connections. Table and
// column names are only ever quoted with pgx.Identifier.Sanitize and values
// only ever sent as parameters, so any string is safe as a name. Every call
// refuses bad input (nil handles, invalid fences, empty names) before
// sending anything, and every call's ctx bounds its statements: a cancelled
// ctx returns an error matching ctx.Err().
//
// The guard table and function are found through the connection's
// search_path, in the schema where the migrations were applied; a missing
// schema returns an error matching [ErrNotMigrated].
package postgres
