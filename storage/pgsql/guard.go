package pgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
)

// Guard admits f inside tx by the rule of [fence.Admits], as one statement on
// the guard table (a call of fencekit_guard_try, which storage/postgres sends
// too, so both packages keep one mark per resource). On success the resource's
// high-water mark is (f.Token, f.Holder) and its guard row stays locked
// until tx ends, so that other holders of the resource wait for tx and then
// see its mark. Make it the first statement of tx: then everything tx reads
// and writes afterwards is fenced.
//
// It must come first because what tx read before it may predate the
// previous holder's commit: at READ COMMITTED a value read before the guard
// is as old as the read, and at REPEATABLE READ and SERIALIZABLE the
// snapshot is taken by the transaction's first statement.
//
// A stale f returns an error wrapping a [*fence.StaleError]
// (errors.Is(err, fence.ErrStale)) whose HighWater is the mark f lost to,
// and changes nothing; telling it costs a second statement, only then. tx
// then holds the guard row lock too (which makes the reported mark exact),
// so roll it back promptly. At REPEATABLE READ and SERIALIZABLE a concurrent
// raise of the mark surfaces as an error matching [ErrRetryable], as do
// deadlocks. A missing guard table or function returns an error matching
// [ErrNotMigrated]: a database migrated before migration 00005 lacks
// fencekit_guard_try, and the error names that migration. Bad input (a nil ctx or tx, an invalid fence) is refused
// with an error matching [fence.ErrInvalid] before anything is sent. ctx
// bounds the statements, including the wait for the row lock.
//
// The guard must stand at the top level of tx, outside any savepoint: a
// rollback to a savepoint taken before it (a nested GORM Transaction that
// returns an error does that) undoes the mark and releases the row lock,
// and the rest of tx runs unfenced while a newer holder commits. So Guard
// checks, in a second statement, that the row it admitted is held by tx
// itself; inside a savepoint it returns an error matching
// [fence.ErrInvalid] that says so, and tx must be rolled back. [InTx] and
// [Once] guard at the top level by construction and need no check.
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
	if err := guard(ctx, tx, f); err != nil {
		return err
	}
	return topLevel(ctx, tx, "Guard", f.Resource)
}

// topLevel refuses a guard that an admitted fence raised inside a savepoint
// of tx (see pgcore.TopLevelSQL); call names the call in the error.
func topLevel(ctx context.Context, tx *sql.Tx, call, resource string) error {
	var top bool
	if err := tx.QueryRowContext(ctx, pgcore.TopLevelSQL, resource).Scan(&top); err != nil {
		return prefixed(fmt.Sprintf("pgsql: %s: savepoint check of %q", call, resource), translate(err))
	}
	if !top {
		return invalid("%s of %q: %s", call, resource, pgcore.SavepointHint)
	}
	return nil
}

func guard(ctx context.Context, tx *sql.Tx, f fence.Fence) error {
	var admitted bool
	err := tx.QueryRowContext(ctx, pgcore.GuardSQL, f.Resource, int64(f.Token), f.Holder).Scan(&admitted)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return prefixed(fmt.Sprintf("pgsql: guard %s", f), translate(err))
	}
	// Stale. The upsert left the row locked by tx, so this read sees the
	// mark that refused f, not a later one.
	mark, err := readMark(ctx, tx, f.Resource)
	if err != nil {
		return err
	}
	return prefixed("pgsql: guard", &fence.StaleError{Fence: f, HighWater: mark})
}

// admit is guard for a transaction that InTx or Once began: the raising
// form of the guard (fencekit_guard_admit, the function storage/postgres's
// batches call), whose refusal carries the mark it lost to in its own
// error (SQLSTATE FK001, the mark in DETAIL), so a stale fence costs no
// statement more. The error aborts tx, which the caller rolls back. form
// (guardFormOf) says which of the guard's statements to send: each is one
// round trip on the driver it is sent to.
func admit(ctx context.Context, form guardForm, tx *sql.Tx, f fence.Fence) error {
	var err error
	switch form {
	case guardLocked:
		_, err = tx.ExecContext(ctx, pgcore.GuardAdmitLockedSQL, f.Resource, int64(f.Token), f.Holder)
	case guardArgs:
		_, err = tx.ExecContext(ctx, pgcore.GuardAdmitSQL, f.Resource, int64(f.Token), f.Holder)
	default:
		_, err = tx.ExecContext(ctx, pgcore.GuardAdmitLiteral(f.Resource, int64(f.Token), f.Holder))
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
// one statement, and one more checks, as [Guard] does, that the guards stand
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
	last := ""
	err := store.GuardAll(ctx, fences,
		func(f fence.Fence) error { return checkFence("GuardAll", f) },
		func(f fence.Fence) error { last = f.Resource; return guard(ctx, tx, f) })
	if err != nil {
		return err
	}
	// Every guard of the call stands at one level of tx: checking one
	// checks them all.
	return topLevel(ctx, tx, "GuardAll", last)
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
