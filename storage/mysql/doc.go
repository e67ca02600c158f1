// Package mysql fences writes to MySQL 8 and MariaDB 10.6+ (through
// database/sql and github.com/go-sql-driver/mysql) with the fences a lock
// hands out, so that a holder whose lease expired while it was paused cannot
// overwrite the work of the holder that came after it. Anything that works on
// a *sql.Tx (GORM, sqlx, ent, sqlc) can fence its transactions with [Guard].
//
// # Importing it beside the driver
//
// This package and github.com/go-sql-driver/mysql are both named mysql.
// Keep the name mysql for this package and import the driver as drv when
// you use its names (drv.Config, drv.MySQLError), or blank when you only
// open databases by name, as the examples do:
//
//	package app
//
//	import (
//		drv "github.com/go-sql-driver/mysql"
//
//		"github.com/fencekit/fencekit/storage/mysql"
//	)
//
//	var (
//		cfg   = drv.NewConfig()                       // the driver's names
//		users = mysql.Table{Name: "users", Key: "id"} // this package's
//	)
//
// # The guard table
//
// migrations.UpMySQL creates fencekit_guard (and refuses a PostgreSQL
// database, naming migrations.Up; every call of this package given a
// PostgreSQL handle fails with an error that names the mix-up and wraps the
// server's). It keeps one high-water mark per resource: the newest fence (token, holder) admitted for it. A fence is
// admitted when its token is above the mark, or equal to it and presented by
// the mark's holder ([fence.Admits]); admission raises the mark in the same
// statement. [Guard] does this as the first statement of the caller's
// transaction ([InTx]: an UPDATE of the existing row, or a locking read of
// it for a fence that already holds the mark; [Guard]: an INSERT ...
// ON DUPLICATE KEY UPDATE) that leaves the guard row exclusively locked
// until the transaction ends, so everything the
// transaction then reads and writes is fenced: no older holder can be
// admitted in between, and newer holders wait for it. A refused fence
// returns a [*fence.StaleError] that carries the mark, which a lock uses to
// heal a counter Redis lost ([HighWater] reads it directly).
//
// The guard must be the transaction's first statement. InnoDB's plain
// SELECTs read a snapshot, and at REPEATABLE READ (the default) the snapshot
// is taken by the transaction's first plain read: a transaction that reads
// before its guard keeps seeing the data from before the previous holder's
// commit after the guard has waited for that commit, and its write loses
// that holder's update. Reads that a later write depends on must be fenced as
// well: guard the read transaction too.
//
// # Ways to use it
//
//   - [InTx] begins a transaction, guards one fence, runs your function and
//     commits, rolling back on any error or panic. It is the usual fenced
//     read-modify-write.
//   - [Guard] fences a transaction you began yourself, for example one that
//     an ORM hands you; [GuardAll] guards several resources, locking their
//     rows in ascending order. Call [CreateGuardRows] first so that neither
//     inserts a guard row inside your transaction: then two transactions
//     cannot deadlock on guard rows. Guard at the top level of the
//     transaction, outside any savepoint (an ORM's nested transaction,
//     such as GORM's nested Transaction, is one): a rollback to a savepoint
//     taken before the guard undoes its mark, and the rest of the
//     transaction is no longer fenced by it. MySQL does not tell a
//     statement whether it runs inside a savepoint, so this package cannot
//     refuse it as storage/pgsql does; [InTx] and [Once] guard at the top
//     level by construction.
//   - [Once] runs a piece of work at most once per key, across fences,
//     instances and retries, by committing a completion record with it.
//   - [Table.Update] and [Table.Upsert] fence single rows of a table that
//     carries its own token and holder columns, and tell a stale fence from a
//     missing row ([fence.ErrNotFound]).
//   - [Table.UpdateVersion] is optimistic locking on a version column,
//     returning a [*fence.ConflictError] when another write came first;
//     [Retry] reruns a read-modify-write on conflicts, deadlocks and lock
//     wait timeouts.
//
// # What a stale fence does to the transaction
//
// MySQL has neither a statement that raises an error from a condition
// without a stored procedure nor a pipelined batch, so admission is one
// statement plus a check in Go: the guard's insert id (which
// LAST_INSERT_ID(n) sets to say how it judged) and affected-row count, and
// on a refusal a locking read of the mark it lost to, from the row the
// guard has locked; or, for a lease's following writes in [InTx] and
// [Once], the judgement a locking read of the guard row returns with the
// mark. A stale fence returns an error before any other
// statement of yours is sent; [InTx] and [Once] then roll back, and callers of
// [Guard] must roll back themselves. Nothing depends on the DSN's flags.
//
// # Types and names
//
// Resources and holders are stored as VARBINARY, byte for byte: "A" and "a"
// (and "a" and "a ") are different resources, whatever the server's
// collation. A resource may be up to [fence.MaxResourceLen] bytes (the
// column and its index hold exactly that), a holder up to [MaxHolderLen];
// tokens are signed BIGINT, so every token a lock issues (up to
// [fence.MaxToken]) and every positive int64 fits. Longer resources and holders, invalid
// fences, nil handles and unusable options are refused with an error
// matching [fence.ErrInvalid] before anything is sent.
//
// Statements on fencekit's own tables send only values checked to fit
// their columns, so they behave the same whatever the session's sql_mode. A
// [Table]'s statements carry the caller's values, which the server would
// cut short under a sql_mode that is not strict: they write nothing there
// and return an error naming sql_mode.
//
// Table and column names are only ever quoted between backticks, with
// backticks doubled, after validation (1 to 64 characters, valid UTF-8, no
// NUL, no trailing space); values are only ever sent as placeholders.
//
// # Isolation levels, retries and outcomes
//
// The guard is correct at READ COMMITTED, REPEATABLE READ and SERIALIZABLE:
// a holder that waited for the guard row reads, after the guard, what its
// rival committed. Deadlocks (error 1213) and lock wait timeouts (1205)
// return an error matching [ErrRetryable] that wraps the *mysql.MySQLError;
// run the whole transaction again, for example with [Retry].
//
// A context that ends while a COMMIT is in flight, or a connection that
// breaks then, leaves the outcome unknown: [InTx] and [Once] return an error
// matching [fence.ErrOutcomeUnknown] rather than guess. Calling [Once] again
// with the same key tells the truth. The same holds for a [Table]'s
// statements outside a transaction. A call that never sent its statement
// says so plainly instead: no connection could be dialled or greeted (the
// Table calls take their connection from the pool before anything else), a
// BEGIN that failed, an argument database/sql cannot convert (it converts
// them all before the driver sends anything), or the driver's
// driver.ErrBadConn, which it returns only when it wrote nothing.
//
// # Round trips
//
// database/sql sends BEGIN, each statement and COMMIT as separate round
// trips, and without interpolateParams=true in the DSN the driver prepares
// every statement that has arguments (one more round trip each). A fenced
// write is BEGIN, guard, your statements and COMMIT. The guard of [InTx]
// and [Once] is one statement. For a fence that the process saw admitted
// last through the same *sql.DB (every transaction of a lease after its
// first) it is a locking read of the guard row (SELECT ... FOR UPDATE),
// which judges the newest committed mark, locks it and writes nothing; a
// refusal returns the mark it read. For any other fence it is one UPDATE
// of the guard row that locks it, judges the mark it locked and raises it
// in the same statement when the fence is newer. The memory of admitted
// fences (bounded, per handle and resource) only chooses between the two:
// both judge the locked row, so a memory that is out of date (another
// process raised the mark, the row was reset) costs a statement, never a
// wrong answer. [Guard] and [GuardAll] upsert the mark in one statement
// that writes the row only when it inserts it or raises the mark. The
// UPDATE and the upsert add a locking read on refusals, for the holder of
// the mark the fence lost to, which no OK packet can carry; the locking
// read adds the UPDATE when it finds the mark below the fence. A
// resource's first [InTx] or [Once] also finds the row missing, rolls
// back, creates the row and begins again.
//
// # Deadlocks on guard rows
//
// InnoDB removes a row that a transaction inserted when that transaction
// rolls back, and turns the row locks of transactions waiting for it into
// gap locks; two of them then insert the row and deadlock. So no guard row
// is inserted inside a transaction that can avoid it: [InTx] and [Once]
// create a missing row (token 0, no holder: a row that admits every fence)
// in a statement committed on its own, and [CreateGuardRows] does the same
// for callers of [Guard] and [GuardAll]. A guard of an existing row locks
// that row alone, so guards in a common order never deadlock.
//
// # Panics
//
// The function given to [InTx], [Once] or [Retry] may panic: the call rolls
// back, returns the connection to the pool and lets the panic continue with
// its original value, so a recovered panic leaves no guard row locked.
//
// # Observability
//
// Every exported call is a span (fencekit.mysql.in_tx, .guard, .guard_all,
// .once, .table_update, .table_upsert, .table_update_version) with the
// fence and the outcome, and every refusal counts in fencekit.fence.rejections
// with storage="mysql" and reason stale or conflict. The package's functions
// take no options, so they use the global OpenTelemetry providers; until a
// program installs an SDK there, the calls start no span (unless the
// caller's span records), which would record nothing.
//
// # Files
//
// guard.go holds the guard and its SQL, tx.go [InTx], [Retry] and the
// commit whose outcome may be unknown, once.go [Once], table.go the
// row-level marks and versions, errors.go the sentinels and the one place
// where driver errors are translated, shared.go the link to the code this
// package shares with storage/postgres (spans, the rejection counter,
// argument checks, GuardAll's order, Retry's loop and a Table's column
// rules).
//
// # Checked against MySQL 8
//
// The tests run against MariaDB 10.11. The statements were checked against
// MySQL 8.0's reference manual: INSERT ... ON DUPLICATE KEY UPDATE with
// placeholders in the update clause, its affected-row counts (1 inserted,
// 2 updated, 0 or with CLIENT_FOUND_ROWS 1 unchanged) and its left-to-right
// assignment; LAST_INSERT_ID(expr) in an UPDATE or an upsert, whose
// value the statement's reply carries as its insert id (the C API's
// mysql_insert_id()), and a reply's insert id of 0 for an UPDATE that set
// none; INSERT IGNORE and its count for a duplicate key (0); SELECT ...
// FOR UPDATE; UTC_TIMESTAMP(6); the CREATE TABLE statements of the
// migrations (VARBINARY, DATETIME(6), CHECK, a backquoted `key` column,
// ROW_FORMAT=DYNAMIC and its 3072-byte index key limit); GET_LOCK and
// RELEASE_LOCK (session-owned, released when the session ends); and error
// numbers 1205, 1213, 1146, 1054 and 3819 (MariaDB: 4025); INSERT ...
// SELECT ... FROM DUAL WHERE ... ON DUPLICATE KEY UPDATE (which statement-based
// binary logging flags as unsafe: use the default, row-based); FIND_IN_SET
// on @@SESSION.sql_mode; LOCK IN SHARE MODE; information_schema.COLUMNS and
// TABLE_CONSTRAINTS; and ALTER TABLE ... DROP CONSTRAINT (MySQL 8.0.19 and
// later, which migration 3 needs). MariaDB's SIMULTANEOUS_ASSIGNMENT
// sql_mode and its error 1020 have no MySQL counterpart.
package mysql
