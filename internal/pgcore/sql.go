package pgcore

// The guard table, its function and the completion table are created by
// the migrations package and found through the connection's search_path.
const (
	// GuardSQL admits (resource, token, holder) and raises the mark, or
	// returns no row when the fence is stale, without aborting the
	// transaction. It always takes the guard row's lock, and writes a new
	// row version only when the mark changes: a transaction that presents
	// the fence that already holds the mark (every write of a lease after
	// its first) locks the row and writes nothing.
	//
	// The rule runs in fencekit_guard_try (migration 00005), whose
	// statements the server plans once per session: drivers that do not
	// prepare statements (lib/pq, pgx's simple protocol) plan only this
	// call each time. The function locks the row with FOR UPDATE, which at
	// READ COMMITTED waits for a holder's transaction and then returns the
	// row version it locked, not the one in the statement's snapshot:
	// judging the mark from the snapshot would admit a fence that a newer
	// holder, committed while it waited, has made stale. When the locked
	// row holds this very fence, it admits from it; otherwise its upsert
	// judges by the admission rule against the row it locks (ON CONFLICT DO
	// UPDATE locks the conflicting row even when its WHERE is false, so a
	// stale caller holds the row lock too and the mark it then reads is the
	// one it lost to), and waits for and judges a row that another
	// transaction inserted meanwhile.
	GuardSQL = `SELECT true WHERE fencekit_guard_try($1, $2, $3)`

	// GuardJudgeSQL is GuardSQL for a guard in the caller's own
	// transaction that also returns, in the same statement, whether the
	// guard row is held at the top level of the transaction (TopLevelSQL's
	// judgment) and the mark after the call: the fence when admitted, the
	// mark that refused it otherwise (fencekit_guard_judge, migration
	// 00009). Guard needs no statement more for either.
	GuardJudgeSQL = `SELECT admitted, top_level, mark_token, mark_holder FROM fencekit_guard_judge($1, $2, $3)`

	// HighWaterSQL reads a resource's mark.
	HighWaterSQL = `SELECT token, holder FROM fencekit_guard WHERE resource = $1`

	// GuardAdmitSQL is the raising form of GuardSQL, for pipelined batches:
	// a stale fence fails with SQLSTATE CodeStale and aborts the transaction.
	GuardAdmitSQL = `SELECT fencekit_guard_admit($1, $2, $3)`

	// GuardAdmitLockedSQL is GuardAdmitSQL that admits the fence holding
	// the mark (every write of a lease after its first) without calling the
	// function, for drivers that prepare it once per connection: the plain
	// statement's plan is kept, and it skips the function's call (PL/pgSQL's
	// frame and its statements' own executor runs).
	// Its EXISTS locks the guard row with FOR UPDATE, which at READ
	// COMMITTED waits for a holder's transaction, locks the newest row
	// version and checks the row's mark against the fence again on that
	// version (EvalPlanQual), never on the snapshot's: it answers true only
	// when the locked version holds this very fence, and leaves the row
	// locked either way. Any other case (a rise, a refusal, a row the
	// snapshot does not see) goes to fencekit_guard_admit, whose statements
	// judge the row they lock as GuardSQL says.
	GuardAdmitLockedSQL = `SELECT CASE WHEN EXISTS (SELECT FROM fencekit_guard WHERE resource = $1 AND token = $2 AND holder = $3 FOR UPDATE) THEN NULL ELSE fencekit_guard_admit($1, $2, $3) END`

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
