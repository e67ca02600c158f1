package postgres

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
)

// unknownOutcome returns err, from a call that commits its own write (an
// autocommit statement, a pipelined batch, a COMMIT), as a
// [*fence.OutcomeUnknownError] for op unless err proves that nothing was
// applied. A request that reached the server may have committed however the
// client's wait for the reply ended: a context that ends, or a connection
// that breaks, after the request was written says nothing about the server.
//
// Only these prove that nothing was applied:
//   - a server error reply of severity ERROR: the statement failed, and its
//     transaction (the batch's implicit one, or the one COMMIT ends) was
//     aborted. FATAL and PANIC replies end the session and prove nothing:
//     a backend terminated while COMMIT waits for a synchronous standby has
//     already committed locally;
//   - pgx's refusal to start on a context that was already done, which it
//     reports as a timeout that is safe to retry (pgconn.Timeout and
//     pgconn.SafeToRetry both hold, and for no other error);
//   - a batch that failed while its statements were prepared or their
//     arguments encoded (pgx.ErrPreprocessingBatch): pgx sends the statements
//     only after both succeeded;
//   - pgx.ErrTxCommitRollback: COMMIT found the transaction aborted and
//     rolled it back;
//   - pgx's refusal to encode an argument (pgcore.EncodeRefused): pgx
//     encodes a statement's arguments before it sends its execution.
//
// pgconn.SafeToRetry alone is not enough: pgx also reports a connection that
// broke while it read a reply, after the request was written, as "conn
// closed", which it marks safe to retry. Everything else, a cut connection
// or an ended context while the batch or COMMIT was in flight, is unknown.
// Statements inside a caller's pgx.Tx commit only with it, so calls made on
// one never use this.
func unknownOutcome(op string, err error) error {
	if err == nil || notApplied(err) {
		return err
	}
	return &fence.OutcomeUnknownError{Op: op, Err: err}
}

func notApplied(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := pgErr.SeverityUnlocalized
		if sev == "" {
			sev = pgErr.Severity
		}
		return sev == "ERROR"
	}
	var prep pgx.ErrPreprocessingBatch
	return (pgconn.Timeout(err) && pgconn.SafeToRetry(err)) || errors.As(err, &prep) || errors.Is(err, pgx.ErrTxCommitRollback) ||
		pgcore.EncodeRefused(err)
}

// commitsItself reports whether a statement sent through db commits by
// itself: db is a pool or a connection, not a transaction of the caller's.
func commitsItself(db any) bool {
	_, inTx := db.(pgx.Tx)
	return !inTx
}
