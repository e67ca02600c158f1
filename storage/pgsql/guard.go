package pgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
)

// Guard admits f inside tx by the rule of [fence.Admits], as one statement
// on the guard table (a call of fencekit_guard_judge, whose rule and table
// storage/postgres's guards share, so both packages keep one mark per
// resource). On success the resource's high-water mark is (f.Token,
// f.Holder) and its guard row stays locked until tx ends, so that other
// holders of the resource wait for tx and then see its mark. Make it the
// first statement of tx: then everything tx reads and writes afterwards is
// fenced.
//
// It must come first because what tx read before it may predate the previous
// holder's commit: at READ COMMITTED a value read before the guard is as old
// as the read, and at REPEATABLE READ and SERIALIZABLE the snapshot is taken
// by the transaction's first statement.
//
// A stale f returns an error wrapping a [*fence.StaleError] (errors.Is(err,
// fence.ErrStale)) whose HighWater is the mark f lost to, and changes
// nothing; the statement that refused f returns that mark too, so telling it
// costs nothing more. tx then holds the guard row lock too (which makes the
// reported mark exact), so roll it back promptly. At REPEATABLE READ and
// SERIALIZABLE a concurrent raise of the mark surfaces as an error matching
// [ErrRetryable], as do deadlocks. A missing guard table or function returns
// an error matching [ErrNotMigrated]: a database migrated before migration
// 00009 lacks fencekit_guard_judge, and the error names that migration. Bad
// input (a nil ctx or tx, an invalid fence) is refused with an error
// matching [fence.ErrInvalid] before anything is sent. ctx bounds the
// statement, including the wait for the row lock.
//
// The guard must stand at the top level of tx, outside any savepoint: a
// rollback to a savepoint taken before it (a nested GORM Transaction that
// returns an error does that) undoes the mark and releases the row lock, and
// the rest of tx runs unfenced while a newer holder commits. So Guard
// checks, in the same statement, that the row it admitted is held by tx
// itself; inside a savepoint it returns an error matching [fence.ErrInvalid]
// that says so, and tx must be rolled back. [InTx] and [Once] guard at the
// top level by construction and need no check.
func Guard(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.pgsql.guard", &f)
	err := guardChecked(ctx, tx, f)
	endSpan(ctx, span, err)
	return err
}

func guardChecked(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	if err := checkFence("Guard", f); err != nil {
		return err
	}
	return judge(ctx, tx, "Guard", f)
}

// judge admits f inside tx, the caller's transaction, by the rule of
// [Guard], in one statement (pgcore.GuardJudgeSQL) that also says whether
// the guard stands at the top level of tx and, on a refusal, the mark f
// lost to; call names the call in the error of a guard inside a savepoint.
func judge(ctx context.Context, tx *sql.Tx, call string, f fence.Fence) error {
	var admitted, top bool
	var token int64
	var holder string
	err := tx.QueryRowContext(ctx, pgcore.GuardJudgeSQL, f.Resource, int64(f.Token), f.Holder).Scan(&admitted, &top, &token, &holder)
	switch {
	case err != nil:
		return prefixed(fmt.Sprintf("pgsql: guard %s", f), translate(err))
	case !admitted:
		// The call left the row locked by tx: the mark it read is the one
		// that refused f, not a later one.
		mark := fence.Fence{Resource: f.Resource, Token: fence.Token(token), Holder: holder}
		return prefixed("pgsql: guard", &fence.StaleError{Fence: f, HighWater: mark})
	case !top:
		return invalid("%s of %q: %s", call, f.Resource, pgcore.SavepointHint)
	}
	return nil
}

// admit is guard for a transaction that InTx or Once began: the raising
// form of the guard (fencekit_guard_admit, the function storage/postgres's
// batches call), whose refusal carries the mark it lost to in its own
// error (SQLSTATE FK001, the mark in DETAIL), so a stale fence costs no
// statement more. The error aborts tx, which the caller rolls back. form
// (guardFormOf) says which of the guard's statements to send.
func admit(ctx context.Context, form guardForm, tx *sql.Tx, f fence.Fence) error {
	var err error
	switch form {
	case guardLocked:
		_, err = tx.ExecContext(ctx, pgcore.GuardAdmitLockedSQL, f.Resource, int64(f.Token), f.Holder)
	default:
		_, err = tx.ExecContext(ctx, pgcore.GuardAdmitSQL, f.Resource, int64(f.Token), f.Holder)
	}
	if err == nil {
		return nil
	}
	if s, ok := pgcore.AsServerError(err); ok && s.Code == pgcore.CodeStale {
		mark, merr := pgcore.StaleMark(f.Resource, s.Detail)
		if merr != nil {
			return prefixed("pgsql: guard", fmt.Errorf("%w: %v", fence.ErrStale, merr))
		}
		return prefixed("pgsql: guard", &fence.StaleError{Fence: f, HighWater: mark})
	}
	return prefixed(fmt.Sprintf("pgsql: guard %s", f), translate(err))
}

// GuardAll guards several resources in one transaction, as [Guard] does for
// one. It locks their guard rows in ascending byte order of resource name,
// whatever the order of fences, so two transactions guarding overlapping sets
// can never deadlock on guard rows. A resource may appear only once. On the
// first stale fence it returns that fence's [*fence.StaleError]; marks raised
// before it are part of tx, which the caller must roll back. Each fence is
// one statement, which also checks, as [Guard] does, that its guard stands
// outside any savepoint.
func GuardAll(ctx context.Context, tx *sql.Tx, fences ...fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.pgsql.guard_all", nil)
	err := guardAll(ctx, tx, fences...)
	endSpan(ctx, span, err)
	return err
}

func guardAll(ctx context.Context, tx *sql.Tx, fences ...fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	return store.GuardAll(ctx, fences,
		func(f fence.Fence) error { return checkFence("GuardAll", f) },
		func(f fence.Fence) error { return judge(ctx, tx, "GuardAll", f) })
}

// HighWater returns the high-water mark of resource: the newest fence the
// guard table admitted for it (through this package or storage/postgres),
// or a Fence with a zero Token when it never admitted one. A lock whose
// counter was lost can advance it past the mark's token. db may be a
// *sql.DB, a *sql.Conn or a *sql.Tx (whose snapshot then applies). A
// resource that no fence could carry (empty, longer than
// [fence.MaxResourceLen], not valid UTF-8 or holding a NUL byte) is refused
// with an error matching [fence.ErrInvalid] before anything is sent. ctx
// bounds the query.
func HighWater(ctx context.Context, db Querier, resource string) (fence.Fence, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return fence.Fence{}, err
	}
	// The resource rule is fence.Validate's own, applied through a fence
	// whose other fields are valid.
	if err := (fence.Fence{Resource: resource, Token: 1, Holder: "-"}).Validate(); err != nil {
		return fence.Fence{}, invalid("HighWater: %w", err)
	}
	return readMark(ctx, db, resource)
}

func readMark(ctx context.Context, db Querier, resource string) (fence.Fence, error) {
	mark := fence.Fence{Resource: resource}
	var token int64
	err := db.QueryRowContext(ctx, pgcore.HighWaterSQL, resource).Scan(&token, &mark.Holder)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return mark, nil
	case err != nil:
		return fence.Fence{}, prefixed(fmt.Sprintf("pgsql: high-water mark of %q", resource), translate(err))
	}
	mark.Token = fence.Token(token)
	return mark, nil
}
