package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// MaxHolderLen is the longest holder id, in bytes, that the guard table
// stores (its holder column is VARBINARY(1024)). Longer holders are refused
// before anything is sent, so that a server outside strict mode can never
// truncate one. Holders of fencekit's locks are 32 bytes.
const MaxHolderLen = 1024

// The guard table is created by migrations.UpMySQL in the connection's
// current database.
const (
	// guardSQL admits (resource, token, holder), inserting the mark or
	// raising it, and leaves the guard row locked (exclusively, whether or
	// not it was raised) until the transaction ends. It writes the row only
	// when it inserts it or raises its mark: under the fence that already
	// holds the mark every column keeps its value, and InnoDB then writes
	// nothing. Arguments: resource, token, holder, then token, token,
	// holder, token for the admission, then token, then token, holder,
	// then token, token.
	//
	// Its answer is the affected-row count and the insert id: a new row
	// counts 1 (id 0), a raised mark 2; an unchanged row counts 0, or 1
	// when the connection asked for found rows (clientFoundRows=true), and
	// its id tells the fence that holds the mark (guardHolds) from a
	// refused one (guardRefused): LAST_INSERT_ID(n) sets the insert id of
	// the statement's reply, and nothing else does (the table has no
	// AUTO_INCREMENT column). IF evaluates only the branch it takes, and
	// 0 * LAST_INSERT_ID(n) adds nothing to admissions.
	//
	// Every condition reads token, which is assigned last: MySQL assigns
	// left to right and each assignment sees the columns already assigned
	// (MariaDB too, unless sql_mode has SIMULTANEOUS_ASSIGNMENT, where all
	// see the old row), so the conditions agree under either rule.
	// Placeholders stand in for VALUES(), which MySQL 8.0.20 deprecated in
	// this clause and MariaDB has no replacement for.
	guardSQL = `INSERT INTO fencekit_guard (resource, token, holder, updated_at)
VALUES (?, ?, ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    admissions = IF(? > token OR (? = token AND ? = holder),
        IF(? > token, admissions + 1, admissions + 0 * LAST_INSERT_ID(1)),
        admissions + 0 * LAST_INSERT_ID(2)),
    updated_at = IF(? > token, UTC_TIMESTAMP(6), updated_at),
    holder     = IF(? > token, ?, holder),
    token      = IF(? > token, ?, token)`

	// admitSQL admits (resource, token, holder) on an existing guard row as
	// guardSQL does, in one UPDATE: it locks the row (an equality search on
	// the primary key: the row's record lock only, and an UPDATE judges the
	// newest committed row, never the transaction's snapshot), raises the
	// mark when the fence is newer and writes nothing otherwise. Arguments:
	// token, token, holder, then token, then token, then token, holder,
	// then token, token, then resource.
	//
	// It answers in the insert id alone, whatever clientFoundRows says:
	// admitRaised, admitHolds or admitRefused as LAST_INSERT_ID(n) set it,
	// or 0 when no row has the resource (the SET list is evaluated for
	// matched rows only). The assignments' order and their conditions are
	// guardSQL's.
	admitSQL = `UPDATE fencekit_guard
SET admissions = IF(? > token OR (? = token AND ? = holder),
        IF(? > token, admissions + 1 + 0 * LAST_INSERT_ID(3), admissions + 0 * LAST_INSERT_ID(1)),
        admissions + 0 * LAST_INSERT_ID(2)),
    updated_at = IF(? > token, UTC_TIMESTAMP(6), updated_at),
    holder     = IF(? > token, ?, holder),
    token      = IF(? > token, ?, token)
WHERE resource = ?`

	// followSQL judges (resource, token, holder) on an existing guard row
	// by fence.Admits with a locking read: it locks the row's record (an
	// equality search on the primary key) and reads its newest committed
	// version, whatever the isolation level or the snapshot, so the mark
	// it judges is exact, and no other holder can change it until the
	// transaction ends. It writes nothing. Its third column is
	// followRaise, followHolds or followRefused. Arguments: token, token,
	// holder, token, then resource.
	//
	// It serves the fence that this process saw admitted last for the
	// resource (see admitted), which mostly holds the mark already: one
	// statement, and no write, for every transaction of a lease after its
	// first.
	followSQL = `SELECT token, holder, IF(? > token OR (? = token AND ? = holder),
        IF(? > token, 3, 1), 2)
FROM fencekit_guard WHERE resource = ? FOR UPDATE`

	// createSQL creates a resource's guard row with no mark yet (token 0,
	// which admits every fence), committed on its own before the transaction
	// that guards it. An existing row is left as it is. It is not INSERT
	// IGNORE, which would also hide a check that an old schema still has
	// (token >= 1: migration 3 of migrations.UpMySQL lifts it).
	createSQL = `INSERT INTO fencekit_guard (resource, token, holder, admissions, updated_at)
VALUES (?, 0, '', 0, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE resource = resource`

	// markSQL reads a resource's mark. As a locking read it sees the newest
	// committed row (and the transaction's own change) whatever the
	// snapshot; after guardSQL the row is locked already, so it waits for
	// nobody and the mark it reads is the one that admitted or refused.
	markSQL = `SELECT token, holder FROM fencekit_guard WHERE resource = ? FOR UPDATE`

	// highWaterSQL reads a resource's mark without locking it.
	highWaterSQL = `SELECT token, holder FROM fencekit_guard WHERE resource = ?`
)

// guardSQL's answers (see guardSQL): the affected-row count of a raised
// mark (MySQL's INSERT ... ON DUPLICATE KEY UPDATE counts a changed row
// 2), and the insert ids of an unchanged row.
const (
	rowsChanged  = 2
	guardHolds   = 1 // LAST_INSERT_ID(1): the fence holds the mark, nothing written
	guardRefused = 2 // LAST_INSERT_ID(2): stale
)

// admitSQL's answers (see admitSQL): its insert id.
const (
	admitNoRow   = 0 // no guard row: nothing evaluated, nothing locked
	admitHolds   = 1 // the fence holds the mark, nothing written
	admitRefused = 2 // stale, nothing written
	admitRaised  = 3 // the mark raised to the fence
)

// followSQL's answers (see followSQL): its third column.
const (
	followHolds   = 1 // the fence holds the mark
	followRefused = 2 // stale
	followRaise   = 3 // the mark is below the fence: admitSQL raises it
)

// Guard admits f as a statement of tx by the rule of [fence.Admits]: one
// INSERT ... ON DUPLICATE KEY UPDATE on the guard table, which raises the
// resource's high-water mark to (f.Token, f.Holder) and locks its guard row
// until tx ends, so that other holders of the resource wait for tx and then
// see its mark. Make it the first statement of tx: then everything tx reads
// and writes afterwards is fenced. It writes the guard row only when it
// inserts it or raises its mark: under the fence that holds the mark (every
// guard of a lease after its first) it locks the row and writes nothing.
//
// It must come first because InnoDB's plain reads are snapshots. At
// REPEATABLE READ (MySQL's default) the snapshot is taken by the
// transaction's first plain SELECT: a transaction that read anything before
// its guard keeps reading data from before the previous holder's commit,
// even after the guard waited for that commit, and writes a lost update. At
// READ COMMITTED each statement reads afresh, but values read before the
// guard are just as old.
//
// A stale f returns a [*fence.StaleError] (errors.Is(err, fence.ErrStale))
// whose HighWater is the mark f lost to, and changes nothing; tx then holds
// the guard row lock too (which makes the reported mark exact), so roll it
// back promptly. Deadlocks and lock wait timeouts return an error matching
// [ErrRetryable]: roll tx back and run it again. A missing guard table
// returns an error matching [ErrNotMigrated]. Bad input (a nil ctx or tx,
// an invalid fence, a holder longer than [MaxHolderLen]) is refused with an
// error matching [fence.ErrInvalid] before anything is sent. ctx bounds the
// statements, including the wait for the row lock (which the server also
// ends after innodb_lock_wait_timeout).
//
// Admission does not depend on the connection's flags: the guard tells an
// admission from a refusal by the affected-row count only where both
// clientFoundRows settings agree, and reads the mark back otherwise.
//
// Deadlocks: a guard of a resource whose guard row exists locks that row
// only, so guards never deadlock on rows that exist. A resource's first
// guard inserts its row as part of tx; if tx then rolls back while two or
// more other transactions wait for that row, InnoDB turns their waits into
// gap locks and picks one of them as a deadlock victim (error 1213, an
// error matching [ErrRetryable]), at every isolation level. Call
// [CreateGuardRows] before the transaction to rule that out. [InTx] and
// [Once] create missing rows themselves, before their transaction.
func Guard(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.guard", &f)
	err := guardChecked(ctx, tx, f)
	endSpan(ctx, span, err)
	return err
}

func guardChecked(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	if err := validate("Guard", f); err != nil {
		return err
	}
	return guard(ctx, tx, f)
}

// validate checks f as every store does, and its holder against the guard
// table's column. op names the call in the error, which matches
// fence.ErrInvalid.
func validate(op string, f fence.Fence) error {
	err := f.Validate()
	if err == nil && len(f.Holder) > MaxHolderLen {
		err = fmt.Errorf("%w: holder of %d bytes is longer than mysql.MaxHolderLen (%d)", fence.ErrInvalid, len(f.Holder), MaxHolderLen)
	}
	if err != nil {
		return &fenceError{op: op, err: err}
	}
	return nil
}

// fenceError is a fence refused by op before anything was sent. Its message
// names the package and the call, then the fence package's reason without
// its own "fence: " prefix.
type fenceError struct {
	op  string
	err error
}

func (e *fenceError) Error() string {
	return "mysql: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "fence: ")
}

func (e *fenceError) Unwrap() error { return e.err }

// validator returns validate for op, in the shape the shared code takes.
func validator(op string) func(fence.Fence) error {
	return func(f fence.Fence) error { return validate(op, f) }
}

func guard(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	t, h := int64(f.Token), f.Holder
	res, err := tx.ExecContext(ctx, guardSQL, f.Resource, t, h,
		t, t, h, t,
		t,
		t, h,
		t, t)
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: guard %s", f), translate(err, true))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: guard %s", f), err)
	}
	if n == rowsChanged {
		return nil
	}
	id, err := res.LastInsertId()
	switch {
	case err == nil && id == guardHolds, err == nil && id == 0 && n == 1:
		// The fence holds the mark (nothing written), or a new row.
		return nil
	case err == nil && id == guardRefused:
		// Stale: the mark it lost to is read below.
	}
	// Refused, or an answer that does not say (a driver without the insert
	// id). The row is locked by tx either way, so its mark settles it, and
	// is the one that refused f.
	mark, err := readMark(ctx, tx, markSQL, f.Resource)
	if err != nil {
		return err
	}
	if mark.Token == f.Token && mark.Holder == f.Holder {
		return nil
	}
	return prefixed("mysql: guard", &fence.StaleError{Fence: f, HighWater: mark})
}

// GuardAll guards several resources in one transaction, as [Guard] does for
// one. It locks their guard rows in ascending byte order of resource name,
// whatever the order of fences, so two transactions guarding overlapping
// sets of resources whose guard rows exist never deadlock on guard rows.
// Rows it has to insert can deadlock as [Guard] says when a transaction
// that inserted them rolls back; [CreateGuardRows] before the transaction
// rules that out. A resource may appear only once. On the first stale fence
// it returns that fence's [*fence.StaleError]; marks raised before it are
// part of tx, which the caller must roll back.
func GuardAll(ctx context.Context, tx *sql.Tx, fences ...fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.guard_all", nil)
	err := guardAll(ctx, tx, fences...)
	endSpan(ctx, span, err)
	return err
}

func guardAll(ctx context.Context, tx *sql.Tx, fences ...fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	sorted, err := store.SortFences(fences, validator("GuardAll"))
	if err != nil {
		return err
	}
	sqlguard.FencesAttrs(ctx, sorted)
	for _, f := range sorted {
		if err := guard(ctx, tx, f); err != nil {
			return err
		}
	}
	return nil
}

// HighWater returns the high-water mark of resource: the newest fence the
// guard table admitted for it, or a Fence with a zero Token when it never
// admitted one. A lock whose counter was lost can advance it past the mark's
// token. db may be a *sql.DB, a *sql.Conn or a *sql.Tx (whose snapshot then
// applies). A resource that is empty or longer than [fence.MaxResourceLen]
// is refused with an error matching [fence.ErrInvalid] before anything is
// sent. ctx bounds the query.
func HighWater(ctx context.Context, db Querier, resource string) (fence.Fence, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return fence.Fence{}, err
	}
	switch {
	case resource == "":
		return fence.Fence{}, invalid("empty resource")
	case len(resource) > fence.MaxResourceLen:
		return fence.Fence{}, invalid("resource of %d bytes is longer than fence.MaxResourceLen (%d)", len(resource), fence.MaxResourceLen)
	}
	return readMark(ctx, db, highWaterSQL, resource)
}

func readMark(ctx context.Context, db Querier, query, resource string) (fence.Fence, error) {
	mark := fence.Fence{Resource: resource}
	var token int64
	err := db.QueryRowContext(ctx, query, resource).Scan(&token, &mark.Holder)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return mark, nil
	case err != nil:
		return fence.Fence{}, prefixed(fmt.Sprintf("mysql: high-water mark of %q", resource), translate(err, true))
	}
	mark.Token = fence.Token(token)
	return mark, nil
}

// errNoGuardRow is admitExisting's answer for a resource without a guard
// row: the caller creates the row (createGuardRow) and begins again.
var errNoGuardRow = errors.New("mysql: no guard row")

// admitExisting admits f as the first statement of a transaction that
// [InTx] or [Once] began, without ever inserting a guard row: a missing row
// returns errNoGuardRow, and the caller rolls back, creates the row in a
// statement of its own and begins again. Inside the transaction only
// existing rows are locked, each by its own record lock, so two such
// transactions never deadlock on guard rows.
//
// It is one statement in the usual cases. The fence this process saw
// admitted last for the resource through db (every transaction of a lease after its
// first) is judged by a locking read (followSQL) that writes nothing; any
// other fence by admitSQL, which raises the mark in the same statement.
// A second statement is sent only when the read finds the mark below the
// fence (the row was reset: admitSQL raises it), or when admitSQL refuses
// the fence (a locking read of the mark it lost to).
func admitExisting(ctx context.Context, db *sql.DB, tx *sql.Tx, f fence.Fence) error {
	var err error
	if admitted.holds(db, f) {
		err = admitFollowing(ctx, tx, f)
	} else {
		err = admitNew(ctx, tx, f)
	}
	if err == nil {
		admitted.remember(db, f)
	} else {
		admitted.forget(db, f.Resource)
	}
	return err
}

// admitFollowing admits f with followSQL, or with admitSQL when the mark is
// below f.
func admitFollowing(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	t, h := int64(f.Token), f.Holder
	mark := fence.Fence{Resource: f.Resource}
	var token, answer int64
	err := tx.QueryRowContext(ctx, followSQL, t, t, h, t, f.Resource).Scan(&token, &mark.Holder, &answer)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return errNoGuardRow
	case err != nil:
		return prefixed(fmt.Sprintf("mysql: guard %s", f), translate(err, true))
	}
	mark.Token = fence.Token(token)
	switch answer {
	case followHolds:
		return nil
	case followRefused:
		return prefixed("mysql: guard", &fence.StaleError{Fence: f, HighWater: mark})
	case followRaise:
		// The row is locked by tx: admitSQL raises the mark just read.
		return admitNew(ctx, tx, f)
	}
	return prefixed(fmt.Sprintf("mysql: guard %s", f), fmt.Errorf("unexpected answer %d", answer))
}

// admitNew admits f with admitSQL: one statement that raises the mark, or
// two when it refuses f (the second reads the mark f lost to).
func admitNew(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	t, h := int64(f.Token), f.Holder
	res, err := tx.ExecContext(ctx, admitSQL, t, t, h,
		t,
		t,
		t, h,
		t, t,
		f.Resource)
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: guard %s", f), translate(err, true))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: guard %s", f), err)
	}
	id, err := res.LastInsertId()
	switch {
	case err != nil:
		// A driver without the insert id: the mark, read below, settles it.
	case id == admitRaised && n == 1, id == admitHolds && n <= 1:
		return nil
	case id == admitNoRow && n == 0:
		return errNoGuardRow
	case id == admitRefused && n <= 1:
		// Stale: the mark it lost to is read below.
	default:
		return prefixed(fmt.Sprintf("mysql: guard %s", f), fmt.Errorf("unexpected answer: %d rows, insert id %d", n, id))
	}
	// The row, if there is one, is locked by tx, so its mark is the one
	// that admitted or refused f: the statement either raised it to f or
	// left it as it was.
	mark, found, err := lockedMark(ctx, tx, f.Resource)
	switch {
	case err != nil:
		return err
	case !found:
		return errNoGuardRow
	case mark.Token == f.Token && mark.Holder == f.Holder:
		return nil
	}
	return prefixed("mysql: guard", &fence.StaleError{Fence: f, HighWater: mark})
}

// lockedMark reads resource's mark with markSQL, and whether it has a
// guard row.
func lockedMark(ctx context.Context, tx *sql.Tx, resource string) (fence.Fence, bool, error) {
	mark := fence.Fence{Resource: resource}
	var token int64
	err := tx.QueryRowContext(ctx, markSQL, resource).Scan(&token, &mark.Holder)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return mark, false, nil
	case err != nil:
		return fence.Fence{}, false, prefixed(fmt.Sprintf("mysql: high-water mark of %q", resource), translate(err, true))
	}
	mark.Token = fence.Token(token)
	return mark, true, nil
}

// createAttempts bounds how often createGuardRow runs its statement again
// after a deadlock.
const createAttempts = 5

// createGuardRow creates resource's guard row, with no mark, in a
// statement that commits on its own (db is not in a transaction). It waits
// for a transaction that holds the row, and leaves an existing row as it
// is. Its only deadlock is with another creator of the same row, after a
// transaction that inserted that row in Guard or GuardAll rolled back:
// since it holds nothing else, it runs again.
func createGuardRow(ctx context.Context, db *sql.DB, resource string) error {
	for i := 1; ; i++ {
		_, err := db.ExecContext(ctx, createSQL, resource)
		if err == nil {
			return nil
		}
		err = translate(err, true)
		if i < createAttempts && isDeadlock(err) {
			continue
		}
		return prefixed(fmt.Sprintf("mysql: create the guard row of %q", resource), err)
	}
}

// existsBatch is how many resources CreateGuardRows looks up per query.
const existsBatch = 100

// CreateGuardRows makes sure every resource has a guard row, creating the
// missing ones with no mark (a row that admits every fence, as a missing
// row does), each in a statement committed on its own. Call it before the
// transaction in which [Guard] or [GuardAll] fences those resources: a
// guard then only locks existing rows and never deadlocks on guard rows.
// [InTx] and [Once] need no such call; they create the row themselves.
//
// It reads which rows exist without locking anything, so for resources
// that have rows it costs one query and waits for nobody; creating a row
// waits for a transaction that is inserting the same row. A resource that is
// empty, longer than [fence.MaxResourceLen], not valid UTF-8 or holding a
// NUL byte is refused with an error matching [fence.ErrInvalid] before
// anything is sent. ctx bounds the statements.
func CreateGuardRows(ctx context.Context, db *sql.DB, resources ...string) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.create_guard_rows", nil)
	err := createGuardRows(ctx, db, resources)
	endSpan(ctx, span, err)
	return err
}

func createGuardRows(ctx context.Context, db *sql.DB, resources []string) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	for _, r := range resources {
		// The fence is only a vehicle for the resource's checks.
		if err := validate("CreateGuardRows", fence.Fence{Resource: r, Token: 1, Holder: "-"}); err != nil {
			return err
		}
	}
	for len(resources) > 0 {
		batch := resources[:min(len(resources), existsBatch)]
		resources = resources[len(batch):]
		missing, err := missingRows(ctx, db, batch)
		if err != nil {
			return err
		}
		for _, r := range missing {
			if err := createGuardRow(ctx, db, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// missingRows returns the resources of batch that have no guard row.
func missingRows(ctx context.Context, db *sql.DB, batch []string) ([]string, error) {
	args := make([]any, len(batch))
	for i, r := range batch {
		args[i] = r
	}
	query := "SELECT resource FROM fencekit_guard WHERE resource IN (?" + strings.Repeat(", ?", len(batch)-1) + ")"
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, prefixed("mysql: CreateGuardRows", translate(err, true))
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		var r []byte
		if err := rows.Scan(&r); err != nil {
			return nil, prefixed("mysql: CreateGuardRows", err)
		}
		found[string(r)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, prefixed("mysql: CreateGuardRows", translate(err, true))
	}
	var missing []string
	for _, r := range batch {
		if !found[r] {
			missing = append(missing, r)
			found[r] = true // a resource named twice is created once
		}
	}
	return missing, nil
}
