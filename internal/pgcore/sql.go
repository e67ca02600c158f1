package pgcore

// The guard table, its functions and the completion table are created by
// the migrations package and found through the connection's search_path.
//
// Every guard that admits a fence writes a new version of the guard row,
// even when the fence already holds the mark (every write of a lease after
// its first): admission comes before the snapshot only if the next holder's
// guard conflicts with that version (DESIGN.md, 4f). At READ COMMITTED the
// next holder waits for the row and its later statements take new
// snapshots, which see this transaction's commit. At REPEATABLE READ and
// SERIALIZABLE its snapshot was taken by its first statement, before its
// guard's wait ended; a row version committed after that snapshot makes its
// guard fail with a serialization failure (40001, a retryable refusal),
// whatever the isolation level of the transaction that wrote it. A guard
// that only locks the row (what migrations 00005 and 00009's functions do
// for the fence that holds the mark) leaves nothing that conflicts, and
// the newer holder was admitted with a snapshot older than the older
// holder's last commit.
//
// The admission is one upsert (guardUpsert): ON CONFLICT DO UPDATE locks the
// newest version of the row, waiting for a holder's transaction, and judges
// the admission rule on that version, never on the statement's snapshot (at
// READ COMMITTED it follows a version committed while it waited; at
// REPEATABLE READ and above such a version fails it with 40001). It locks
// the row even when the rule refuses, so a refused caller holds the row
// lock too and the mark it then reads is the one it lost to. Only a refusal
// calls a function of the migrations, which tells the mark in the form each
// caller needs.
const guardUpsert = `INSERT INTO fencekit_guard AS g (resource, token, holder)
	VALUES ($1, $2, $3)
	ON CONFLICT (resource) DO UPDATE
		SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
		WHERE EXCLUDED.token > g.token
		   OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder)`

const (
	// GuardSQL admits (resource, token, holder), writing the guard row as
	// the package comment says, and returns a row when it admitted and none
	// when the fence is stale, without aborting the transaction; the row
	// stays locked by the transaction either way.
	GuardSQL = guardUpsert + `
	RETURNING true`

	// GuardJudgeSQL is GuardSQL for a guard in the caller's own
	// transaction that also returns, in the same statement, whether the
	// guard row is held at the top level of the transaction (TopLevelSQL's
	// judgment: the version the upsert wrote carries the top-level
	// transaction id, never a savepoint's) and the mark after the call:
	// the fence when admitted, the mark that refused it otherwise (then read
	// by fencekit_guard_judge, migration 00009, on the row the upsert
	// locked). Guard needs no statement more for either.
	GuardJudgeSQL = `WITH u AS (` + guardUpsert + `
	RETURNING g.token, g.holder, g.xmin::text::bigint = txid_current() % 4294967296 AS top_level)
SELECT true, u.top_level, u.token, u.holder FROM u
UNION ALL
SELECT j.admitted, j.top_level, j.mark_token, j.mark_holder
FROM fencekit_guard_judge($1, $2, $3) AS j WHERE NOT EXISTS (SELECT FROM u)`

	// HighWaterSQL reads a resource's mark.
	HighWaterSQL = `SELECT token, holder FROM fencekit_guard WHERE resource = $1`

	// GuardAdmitSQL is the raising form of GuardSQL, for pipelined batches
	// and the transactions InTx and Once begin: a stale fence fails with
	// SQLSTATE CodeStale (raised by fencekit_guard_admit, called only on a
	// refusal, which judges the row the upsert left locked and puts the mark
	// in DETAIL) and aborts the transaction. It returns no row.
	GuardAdmitSQL = `WITH u AS (` + guardUpsert + `
	RETURNING true)
SELECT fencekit_guard_admit($1, $2, $3) WHERE NOT EXISTS (SELECT FROM u)`

	// GuardAdmitLockedSQL was GuardAdmitSQL without the function's call for
	// the fence holding the mark, which only locked the row; every
	// admission now writes it, so it is GuardAdmitSQL.
	GuardAdmitLockedSQL = GuardAdmitSQL

	// OnceClaimSQL writes key's completion record unless one exists, and
	// returns a row only when it wrote one. Against a record that another
	// transaction wrote and has not yet ended, it waits for that transaction:
	// at READ COMMITTED it then writes nothing if the other committed, and
	// writes the record if the other rolled back. $4 is the holder's mark
	// (fence.HolderMark), never the holder id.
	OnceClaimSQL = `INSERT INTO fencekit_once (key, resource, token, holder)
VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO NOTHING
RETURNING true`

	// OnceLookupSQL reads key's completion record.
	OnceLookupSQL = `SELECT resource, token, holder, done_at FROM fencekit_once WHERE key = $1`

	// MissingColumnsSQL returns which of the columns $2 the table $1 (a
	// quoted, possibly schema-qualified name) lacks, in the order given.
	MissingColumnsSQL = `SELECT coalesce(array_agg(u.c ORDER BY u.o), '{}')
FROM unnest($2::text[]) WITH ORDINALITY AS u(c, o)
WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
	WHERE a.attrelid = to_regclass($1) AND a.attname = u.c AND a.attnum > 0 AND NOT a.attisdropped)`
)

// AdmitRowSQL is the admission rule on a row's own columns, for $2 (token)
// and $3 (holder); a NULL token is no mark.
func AdmitRowSQL(tokenCol, holderCol string) string {
	return "(" + tokenCol + " IS NULL OR " + tokenCol + " < $2 OR (" + tokenCol + " = $2 AND " + holderCol + " = $3))"
}

// MissingMarkColumnsSQL is MissingColumnsSQL for the two columns of a row's
// mark, $2 (token) and $3 (holder), for drivers that send no arrays.
const MissingMarkColumnsSQL = `SELECT coalesce(string_agg(u.c, ',' ORDER BY u.o), '')
FROM unnest(ARRAY[$2, $3]::text[]) WITH ORDINALITY AS u(c, o)
WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
	WHERE a.attrelid = to_regclass($1) AND a.attname = u.c AND a.attnum > 0 AND NOT a.attisdropped)`

// TopLevelSQL reports, right after a guard admitted a fence for resource $1
// in the caller's transaction, whether the guard stands at the top level of
// that transaction rather than inside a savepoint: the guard row's version
// was written (xmin) or locked (xmax) by the top-level transaction itself,
// whereas inside a savepoint it carries the savepoint's own transaction id.
// A rollback to that savepoint would undo the guard, its mark and its row
// lock, and leave the rest of the transaction unfenced. txid_current()
// (the top-level id with its epoch; its low 32 bits are the xid) is used
// rather than pg_current_xact_id() so that it runs on every version.
const TopLevelSQL = `SELECT coalesce(bool_or(xmin::text::bigint = txid_current() % 4294967296
    OR xmax::text::bigint = txid_current() % 4294967296), false)
FROM fencekit_guard WHERE resource = $1`

// TopLevelMarkSQL is TopLevelSQL that also returns the mark of resource
// $1, for a batch that sends it right after the guard statement: the guard
// left the row locked by the transaction, admitted or not, so the mark it
// reads is the one the guard judged (at READ COMMITTED its snapshot is
// newer than the lock; at REPEATABLE READ and above a lock on a version
// newer than the snapshot fails the guard with a serialization failure).
// A refusal then needs no statement more to say what it lost to.
const TopLevelMarkSQL = `SELECT xmin::text::bigint = txid_current() % 4294967296
    OR xmax::text::bigint = txid_current() % 4294967296, token, holder
FROM fencekit_guard WHERE resource = $1`

// SavepointHint is the message for a guard refused inside a savepoint.
const SavepointHint = "the transaction is inside a savepoint (a nested transaction, such as GORM's nested Transaction or pgx's Tx.Begin): " +
	"a rollback to it would undo the guard and leave the rest of the transaction unfenced; " +
	"guard at the top level of the transaction, as its first statement, and roll this transaction back"
