package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
)

// TxFunc is the body of a fenced transaction. It runs after the guard
// admitted the fence; whatever it reads and writes through tx is fenced. It
// is an alias, as in storage/pgsql and storage/mysql: any func literal of
// this shape is one.
type TxFunc = func(ctx context.Context, tx pgx.Tx) error

// InTx runs fn in a transaction fenced by f: it begins a transaction with
// opts, admits f by the rule of [Guard] as its first statement, runs fn and
// commits. If the guard or fn fails, or the server refuses the commit, the
// transaction is rolled back and nothing fn did is kept; a commit cut off in
// flight is the one case where InTx cannot tell, and says so (see below).
//
// On a pool or a connection, BEGIN and the guard go to the server in one
// batch: a fenced transaction takes as many round trips as the same
// transaction unfenced. A stale f returns an error wrapping a
// [*fence.StaleError] without running fn; its mark comes from the statement
// that refused f. Serialization
// failures and deadlocks (SQLSTATE 40001, 40P01), from the guard, from fn's
// statements or from the commit, return an error matching [ErrRetryable];
// wrap InTx in [Retry] to run it again. Other errors from fn are returned as
// they are.
//
// The zero opts use the server's defaults (READ COMMITTED, read-write).
// Non-zero opts need a pool or a connection (a db with BeginTx); on a pgx.Tx, InTx runs in a savepoint of that transaction and
// opts must be zero. ctx bounds the whole transaction, fn included; when it
// ends before COMMIT is sent, the transaction is rolled back and the error
// matches ctx.Err(). When it ends, or the connection breaks, while COMMIT
// is in flight, the transaction may have committed: the error then matches
// [fence.ErrOutcomeUnknown] as well as its cause (see "When the outcome is
// unknown" in the package doc). In a savepoint nothing commits before the
// caller's own COMMIT, so there InTx never returns that error.
//
// If fn panics, InTx rolls the transaction back (releasing the guard row and
// returning the connection to its pool) and lets the panic continue with its
// original value.
func InTx(ctx context.Context, db Beginner, opts pgx.TxOptions, f fence.Fence, fn TxFunc) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.in_tx", &f)
	err := forHandle("InTx", inTx(ctx, db, opts, f, fn, "postgres: InTx commit"), db)
	endSpan(ctx, span, err)
	return err
}

// inTx is InTx; op names the call in an error whose outcome is unknown.
func inTx(ctx context.Context, db Beginner, opts pgx.TxOptions, f fence.Fence, fn TxFunc, op string) (err error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if fn == nil {
		return invalid("nil transaction function")
	}
	if err := checkFence(strings.TrimSuffix(strings.TrimPrefix(op, "postgres: "), " commit"), f); err != nil {
		return err
	}
	var tx pgx.Tx
	pipelined := false
	if b, ok := db.(Batcher); ok && commitsItself(db) {
		// A pool or a connection: BEGIN and the guard go in one batch.
		pipelined = true
		tx, err = beginGuarded(ctx, b, opts, f)
	} else if opts != (pgx.TxOptions{}) {
		b, ok := db.(txBeginner)
		if !ok {
			return invalid("transaction options need a pool or a connection, not %T", db)
		}
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		if pipelined {
			return err
		}
		return fmt.Errorf("postgres: begin: %w", translate(err, f))
	}
	committed := false
	defer func() {
		// This runs when fn panics too: the guard row and the connection must
		// not outlive the call, or every later holder of the resource waits
		// for a transaction nobody will end. The panic then continues.
		if !committed {
			// A rollback error adds nothing: the transaction is void either
			// way, and pgx closes the connection if it cannot roll back.
			_ = tx.Rollback(ctx)
		}
	}()
	if !pipelined {
		if err := guard(ctx, tx, f); err != nil {
			return err
		}
	}
	if err := fn(ctx, tx); err != nil {
		return translate(err, f)
	}
	// COMMIT that cannot be sent commits nothing; say so rather than let the
	// driver's error for it pass for one in flight. The deferred rollback
	// then ends the transaction (or the connection, which aborts it).
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("postgres: commit not sent: %w", err)
	}
	if tx.Conn().IsClosed() {
		return errors.New("postgres: commit not sent: the connection is closed")
	}
	if err := tx.Commit(ctx); err != nil {
		err = fmt.Errorf("postgres: commit: %w", translate(err, f))
		if !commitsItself(db) {
			// A savepoint's release commits nothing: the caller's
			// transaction decides, and a failure here leaves it aborted.
			return err
		}
		return unknownOutcome(op, err)
	}
	committed = true
	return nil
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
// the work may already have been applied.
//
// fn must redo the whole read-modify-write, reading afresh. Retry returns
// fn's last error; if ctx ends while waiting, it returns an error matching
// ctx.Err() that also wraps fn's last error. A panic in fn is not retried: it
// continues unchanged, and Retry holds nothing that it would leak.
func Retry(ctx context.Context, attempts int, fn func(ctx context.Context) error) error {
	return store.Retry(ctx, attempts, DefaultRetryAttempts, fn)
}

// beginGuarded begins a transaction on db (a pool or a connection) with
// opts and admits f as its first statement, both in one batch: one round
// trip where BEGIN and then the guard took two. The guard is the raising
// form (fencekit_guard_admit): a stale f fails with SQLSTATE CodeStale,
// whose DETAIL carries the mark it lost to, read by the statement that
// refused it, so the refusal needs no statement more. The error aborts the
// transaction, which is rolled back here; nothing of it is kept.
//
// No outcome is unknown here: the batch commits nothing (a reply lost or a
// context ended in flight leaves an open transaction, which the server
// rolls back when the connection closes, and a BEGIN that failed makes the
// server skip the guard up to the batch's end). On success the transaction
// holds the guard row lock, as after [Guard], and the caller must end it.
func beginGuarded(ctx context.Context, db Batcher, opts pgx.TxOptions, f fence.Fence) (pgx.Tx, error) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	b.BeginTx(opts)
	b.Queue(guardAdmitSQL, f.Resource, int64(f.Token), f.Holder)
	br := db.SendBatch(ctx, b)
	tx := br.Tx()
	_, berr := br.Exec()
	var gerr error
	if berr == nil {
		_, gerr = br.Exec()
	}
	cerr := br.Close()
	var err error
	switch {
	case berr != nil:
		err = fmt.Errorf("postgres: begin: %w", translate(berr, f))
	case gerr != nil:
		var stale *fence.StaleError
		if err = translate(gerr, f); errors.As(err, &stale) {
			err = prefixed("postgres: guard", stale)
		} else {
			err = prefixed(fmt.Sprintf("postgres: guard %s", f), err)
		}
	case cerr != nil:
		err = prefixed(fmt.Sprintf("postgres: guard %s", f), translate(cerr, f))
	default:
		return tx, nil
	}
	if tx != nil {
		// Also returns a pool's connection, which the transaction holds.
		_ = tx.Rollback(ctx)
	}
	return nil, err
}
