package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fencekit/fencekit/fence"
)

// TxFunc is the body of a fenced transaction. It runs after the guard
// admitted the fence; whatever it reads and writes through tx is fenced. It
// must not commit or roll back tx itself.
type TxFunc = func(ctx context.Context, tx *sql.Tx) error

// InTx runs fn in a transaction fenced by f: it begins a transaction with
// opts, guards f with [Guard] as its first statement, runs fn and commits.
// If the guard, fn or the commit fails, the transaction is rolled back and
// nothing fn did is kept.
//
// A stale f returns a [*fence.StaleError] without running fn. InTx never
// deadlocks on guard rows: a resource without a guard row gets one (with
// no mark, which admits every fence) from a statement committed on its own
// before the transaction begins, so inside the transaction the guard only
// locks an existing row; and a deadlock on the guard statement (possible
// only against a [Guard] that inserted the row in its own transaction)
// begins the transaction again before fn runs. Deadlocks and lock wait
// timeouts (errors 1213 and 1205) of fn's statements, and lock wait
// timeouts of the guard, return an error matching [ErrRetryable]; wrap InTx
// in [Retry] to run it again. Other errors from fn are returned as they
// are.
//
// nil opts use the server's defaults (REPEATABLE READ on MySQL and MariaDB,
// unless the server or DSN says otherwise); opts may set any isolation level
// (the guard is correct at each of them) but not ReadOnly, since the guard
// writes. ctx bounds the whole transaction, fn included. If it ends before
// the COMMIT is sent, the transaction is rolled back and the error matches
// ctx.Err(). If it ends while the COMMIT is in flight, or the connection
// breaks then, nobody can tell whether the transaction committed: InTx
// returns an error matching [fence.ErrOutcomeUnknown] (and its cause) at
// once, never one that says nothing happened. The connection stays busy
// with the COMMIT until the server answers or the driver gives up (set
// readTimeout in the DSN to bound that). To find out, read under a new
// fence, or run the work through [Once], which makes a retry tell the truth.
//
// If fn panics, InTx rolls the transaction back (releasing the guard row and
// returning the connection to db's pool) and lets the panic continue with
// its original value.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.in_tx", &f)
	err := inTx(ctx, db, opts, f, fn)
	endSpan(ctx, span, err)
	return err
}

func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	if err := checkTx(ctx, "InTx", db, opts, f, fn); err != nil {
		return err
	}
	return runGuarded(ctx, db, opts, "mysql: InTx", f, func(ctx context.Context, tx *sql.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return translate(err, false)
		}
		return nil
	})
}

// guardStarts bounds how often [InTx] and [Once] begin their transaction:
// again after finding no guard row, and after a deadlock on the guard
// statement, both before fn runs.
const guardStarts = 4

// restartError is a deadlock on the guard statement, the transaction's
// first: nothing of fn has run, so the transaction can begin again.
type restartError struct{ err error }

func (e *restartError) Error() string { return e.err.Error() }
func (e *restartError) Unwrap() error { return e.err }

// runGuarded runs body in a transaction whose first statement admits f.
// The guard row is created, when missing, by a statement committed on its
// own before the transaction begins (then it begins again), so inside the
// transaction the guard only ever locks an existing row; a deadlock on the
// guard statement (possible only against a Guard or GuardAll that inserted
// the row in its own transaction) begins it again too. The last start
// guards as [Guard] does, inserting the row if it is missing still.
func runGuarded(ctx context.Context, db *sql.DB, opts *sql.TxOptions, op string, f fence.Fence, body TxFunc) error {
	for start := 1; ; start++ {
		last := start == guardStarts
		err := runTx(ctx, db, opts, op, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			if last {
				err = guard(ctx, tx, f)
			} else {
				err = admitExisting(ctx, db, tx, f)
			}
			if err != nil {
				if !last && isDeadlock(err) {
					return &restartError{err}
				}
				return err
			}
			return body(ctx, tx)
		})
		var restart *restartError
		switch {
		case errors.Is(err, errNoGuardRow):
			if err := createGuardRow(ctx, db, f.Resource); err != nil {
				return prefixed(op, err)
			}
		case errors.As(err, &restart):
		default:
			return err
		}
	}
}

// checkTx refuses what InTx and Once cannot use, before anything is sent.
func checkTx(ctx context.Context, op string, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if fn == nil {
		return invalid("nil transaction function")
	}
	if opts != nil && opts.ReadOnly {
		return invalid("a read-only transaction cannot be fenced: the guard writes its mark")
	}
	return validate(op, f)
}

// runTx begins a transaction, runs body and commits, rolling back on any
// error or panic of body (the panic then continues), as every database/sql
// guard does (sqlguard.RunTx). op names the call in errors.
func runTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, op string, body TxFunc) error {
	return store.RunTx(ctx, db, opts, op, func(err error) error { return translate(err, false) },
		func(err error) (error, bool) { return commitNotApplied(op+" commit", err) }, body)
}

// DefaultRetryAttempts is how many times [Retry] calls its function when
// attempts is zero.
const DefaultRetryAttempts = 10

// Retry calls fn until it succeeds, returns an error that a retry cannot
// cure, or has been called attempts times (zero means
// [DefaultRetryAttempts]). It retries errors that match [ErrRetryable] or
// [fence.ErrConflict], waiting a short randomised, growing delay (1 ms
// doubling up to 100 ms) between calls; it never retries [fence.ErrStale],
// since a newer holder will stay newer, nor [fence.ErrOutcomeUnknown], since
// the work may have been done.
//
// fn must redo the whole read-modify-write, reading afresh. Retry returns
// fn's last error; if ctx ends while waiting, it returns an error matching
// ctx.Err() that also wraps fn's last error. A panic in fn is not retried: it
// continues unchanged, and Retry holds nothing that it would leak.
func Retry(ctx context.Context, attempts int, fn func(ctx context.Context) error) error {
	return store.Retry(ctx, attempts, DefaultRetryAttempts, fn)
}
