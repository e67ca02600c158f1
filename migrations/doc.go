// Package migrations holds the schema that fencekit's PostgreSQL storage
// guard and PostgreSQL lock need, as goose v3 SQL migrations embedded in the binary.
//
// [Up] applies them through a *sql.DB, [UpPool] through a pgx pool
// (*pgxpool.Pool), both with a goose Provider: PostgreSQL dialect, a session-level
// advisory lock so that several processes starting at once apply each
// migration exactly once, and a version table of its own ([VersionTable]) so
// that fencekit's versions never mix with the application's own goose
// history. Running [Up] again when everything is applied changes nothing.
//
// The migrations create, in the first schema of the connection's search_path:
//
//   - fencekit_guard(resource, token, holder, updated_at): one high-water mark
//     per resource, the newest fence admitted for it;
//   - fencekit_guard_admit(resource, token, holder): the admission rule as a
//     function that raises SQLSTATE FK001 on a stale fence (the mark it lost
//     to in the error's detail), used by storage/postgres's one-round-trip
//     batches (Exec, and InTx and Once, whose batch sends BEGIN with it) and
//     by storage/pgsql's InTx and Once; 00005 replaces it with one that
//     writes the guard row only when the mark changes;
//   - fencekit_guard_try(resource, token, holder) (00005): the same rule,
//     returning false on a stale fence instead of raising, used where the
//     caller's transaction must stay usable after a refusal (Guard and
//     GuardAll of storage/postgres, InTx on a pgx.Tx),
//     which fail with their ErrNotMigrated, naming 00005, until it is
//     applied;
//   - fencekit_guard_judge(resource, token, holder) (00009): the same rule
//     for storage/pgsql's Guard and GuardAll, returning in one row whether it
//     admitted, whether the guard row is held at the top level of the
//     transaction (not by a savepoint inside it) and the mark after the
//     call (on a refusal, the mark that refused it), so that those calls
//     are one statement; they fail with ErrNotMigrated, naming 00009, until
//     it is applied;
//   - fencekit_once(key, resource, token, holder, done_at): one completion
//     record per key of work run through storage/postgres's Once, with an
//     index on done_at for deleting old records. holder is the holder's
//     mark (fence.HolderMark, as logs show it), never the holder id, which
//     is the lock's secret; 00004 converts records written before it. fencekit never deletes
//     them; see Once for what deleting one means;
//   - fencekit_lock and fencekit_lock_waiter (00006), UNLOGGED, and the
//     fencekit_lock_* functions: the PostgreSQL lock of package lock/pglock
//     (one row per active resource, one per queued waiter; rows of idle
//     resources are reclaimed by the lock itself); 00007 adds the
//     fencekit_lock.waiting flag (the resource may have queued waiters),
//     with which an uncontended grant or release is one UPDATE, and
//     00008 fencekit_lock_grant, the grant answering in one array: the
//     lock now sends its uncontended grant and release as plain SQL (that
//     UPDATE, and fencekit_lock_grant or fencekit_lock_release_full in the
//     same statement when it matched no row), and calls
//     fencekit_lock_acquire and fencekit_lock_release only on a database
//     without 00008.
//
// A database migrated by an earlier version gets the new objects from the
// next [Up]: only the migrations it lacks are applied.
//
// Teams that run goose themselves can use the same files: [FS] holds them at
// its root, exactly as they are in this directory, e.g.
//
//	goose -dir ./migrations -table fencekit_db_version postgres "$DATABASE_URL" up
//
// Use the same table name as [VersionTable] if both [Up] and the goose command
// may run against one database.
//
// MySQL 8 and MariaDB 10.6+ have migrations of their own, for storage/mysql,
// in [MySQLFS] (the mysql directory): [UpMySQL] applies them with goose's
// MySQL dialect, the same version table name in the connection's current
// database, and the named lock [MySQLLockName] (GET_LOCK) so that processes
// starting at once apply each one once. They create fencekit_guard (marks)
// and fencekit_once (completion records), e.g. with the goose command:
//
//	goose -dir ./migrations/mysql -table fencekit_db_version mysql "$DSN" up
package migrations
