package sqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

// RunTx is the fenced transaction of a database/sql adapter: it begins a
// transaction on db with opts, runs body and commits, rolling back on any
// error or panic of body (the panic then continues). op names the call in
// errors ("pgsql: InTx"); begin translates BeginTx's error. The COMMIT's
// outcome is classified as [Store.Commit] does.
func (s *Store) RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, op string,
	begin func(error) error, notApplied func(error) (error, bool),
	body func(ctx context.Context, tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, begin(err))
	}
	committing := false
	defer func() {
		// This runs when body panics too: the guard row and the connection
		// must not outlive the call, or every later holder of the resource
		// waits for a transaction nobody will end. The panic then continues.
		if !committing {
			// A rollback error adds nothing: the transaction is void either
			// way, and database/sql discards a connection it cannot roll
			// back.
			_ = tx.Rollback()
		}
	}()
	if err := body(ctx, tx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: commit not sent: %w", op, err)
	}
	committing = true
	if ctx.Done() == nil || (s.CommitWatchesContext != nil && s.CommitWatchesContext(db)) {
		// Nothing can end ctx, or the driver's commit returns when ctx
		// ends: the caller's goroutine may wait for the reply itself.
		return commitOutcome(ctx, op+" commit", tx.Commit(), notApplied)
	}
	return s.Commit(ctx, tx, op+" commit", notApplied)
}

// Commit commits tx and says whether the outcome is known. It returns as
// soon as ctx ends: database/sql's Commit does not watch the context once
// the COMMIT is sent (lib/pq waits for the reply however long it takes), so
// it runs in another goroutine and finishes in the background. [Store.RunTx]
// commits in the caller's goroutine instead when nothing can end ctx or the
// driver watches it (Store.CommitWatchesContext): the hand-over to another
// goroutine and back costs a fenced transaction on loopback about a tenth
// of a plain one's time.
//
// The outcome is known only when the error proves that nothing committed:
// sql.ErrTxDone after database/sql rolled back for an ended context, or an
// error for which notApplied returns true (with the error to return,
// already prefixed). Everything else, a context that ends or a connection
// that breaks while COMMIT is in flight, returns a
// [*fence.OutcomeUnknownError] for op. A bare context error proves nothing:
// database/sql returns one when the context ended just before it would have
// sent COMMIT, but pgx's stdlib returns one too for a COMMIT it sent and
// stopped waiting for. Callers check the context before calling Commit, so
// only an ending in that narrow window is reported as unknown needlessly.
func (s *Store) Commit(ctx context.Context, tx *sql.Tx, op string, notApplied func(error) (error, bool)) error {
	done := make(chan error, 1)
	go func() { done <- tx.Commit() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		select {
		case err = <-done: // finished at the same moment: its answer counts
		default:
			return &fence.OutcomeUnknownError{Op: op, Err: ctx.Err()}
		}
	}
	return commitOutcome(ctx, op, err, notApplied)
}

// commitOutcome classifies err, what tx.Commit returned for op, as
// [Store.Commit] says; ctx is the call's context.
func commitOutcome(ctx context.Context, op string, err error, notApplied func(error) (error, bool)) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil:
		// The context ended first and database/sql rolled back instead of
		// committing.
		return fmt.Errorf("%s: %w", op, ctx.Err())
	case errors.Is(err, sql.ErrTxDone):
		// fn ended the transaction itself: whether it committed is not ours
		// to know.
		return &fence.OutcomeUnknownError{Op: op, Err: fmt.Errorf("transaction already ended: %w", err)}
	}
	if known, ok := notApplied(err); ok {
		return known
	}
	return &fence.OutcomeUnknownError{Op: op, Err: err}
}
