package pgsql

import (
	"context"
	"database/sql"

	"github.com/fencekit/fencekit/fence"
)

// TxFunc is the body of a fenced transaction. It runs after the guard
// admitted the fence; whatever it reads and writes through tx is fenced. It
// must not commit or roll back tx itself.
type TxFunc = func(ctx context.Context, tx *sql.Tx) error

// InTx runs fn in a transaction fenced by f: it begins a transaction with
// opts, admits f by the rule of [Guard] as its first statement, runs fn and
// commits.
// If the guard, fn or the commit fails, the transaction is rolled back and
// nothing fn did is kept; a COMMIT cut off in flight is the one case where
// InTx cannot tell, and says so (see below).
//
// A stale f returns an error wrapping a [*fence.StaleError] without running
// fn; its mark comes with the refusal of the guard statement itself (the
// raising guard, fencekit_guard_admit, which aborts the transaction InTx
// then rolls back), so telling it costs no statement more. Serialization failures and deadlocks (SQLSTATE 40001, 40P01), from the
// guard, from fn's statements or from the commit, return an error matching
// [ErrRetryable]; wrap InTx in [Retry] to run it again. Other errors from fn
// are returned as they are.
//
// nil opts use the server's defaults (READ COMMITTED unless the server or
// the connection says otherwise); opts may set any isolation level (the
// guard is correct at each of them) but not ReadOnly, since the guard
// writes. ctx bounds the whole transaction, fn included. If it ends before
// the COMMIT is sent, the transaction is rolled back and the error matches
// ctx.Err(). If it ends while the COMMIT is in flight, or the connection
// breaks then, nobody can tell whether the transaction committed: InTx
// returns an error matching [fence.ErrOutcomeUnknown] (and its cause) at
// once, never one that says nothing happened. To find out, read under a new
// fence, or run the work through [Once], which makes a retry tell the truth.
//
// If fn panics, InTx rolls the transaction back (releasing the guard row and
// returning the connection to db's pool) and lets the panic continue with
// its original value.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	ctx, span := startSpan(ctx, "fencekit.pgsql.in_tx", &f)
	err := inTx(ctx, db, opts, f, fn)
	endSpan(ctx, span, err)
	return err
}

func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	if err := checkTx(ctx, "InTx", db, opts, f, fn); err != nil {
		return err
	}
	form := guardFormOf(ctx, db)
	return runTx(ctx, db, opts, "pgsql: InTx", func(ctx context.Context, tx *sql.Tx) error {
		if err := admit(ctx, form, tx, f); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return translate(err)
		}
		return nil
	})
}

// checkTx refuses what InTx and Once (call) cannot use, before anything is
// sent.
func checkTx(ctx context.Context, call string, db *sql.DB, opts *sql.TxOptions, f fence.Fence, fn TxFunc) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if fn == nil {
		return invalid("%s: nil transaction function", call)
	}
	if opts != nil && opts.ReadOnly {
		return invalid("%s: a read-only transaction cannot be fenced: the guard writes its mark", call)
	}
	return checkFence(call, f)
}

// runTx begins a transaction, runs body and commits, rolling back on any
// error or panic of body. op names the call in errors.
func runTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, op string, body TxFunc) error {
	return store.RunTx(ctx, db, opts, op, translate,
		func(err error) (error, bool) { return notApplied(op+" commit", err) }, body)
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
