package pglock

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// retrying sends each statement again when the session it went out on
// broke before its answer came back: a session the server ended (its
// pg_terminate_backend, a restart, a failover), or a pooled connection that
// died while idle and is found dead only by the next statement on it. pgx
// retries nothing, where go-redis retries a command after a connection
// error; this gives the PostgreSQL lock the same footing. It is safe
// because every statement of the backend gives the same answer to a repeat
// of a run that already happened: a grant tried again by its holder returns
// that grant, an extension never shortens, a release repeated answers that
// the lock is no longer held, a record write repeated is the same record.
//
// A pool may hold several connections that died at once; each failed try
// drops one, so up to one more try than the pool has connections is made,
// while ctx lasts.
type retrying struct {
	pool  *pgxpool.Pool
	tries int // the pool's connections + 1, read once: Pool.Config copies the whole config
}

func newRetrying(pool *pgxpool.Pool) retrying {
	return retrying{pool: pool, tries: int(pool.Config().MaxConns) + 1}
}

func (r retrying) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &retryRow{pool: r.pool, tries: r.tries, ctx: ctx, sql: sql, args: args}
}

// retryRow runs its statement when it is scanned, as pgx's own rows do.
type retryRow struct {
	pool  *pgxpool.Pool
	tries int
	ctx   context.Context
	sql   string
	args  []any
	// ranBefore is set by Scan when a try before the one that answered
	// may have run: its request may still reach the server.
	ranBefore bool
}

func (r *retryRow) Scan(dest ...any) error {
	ran := false // an earlier try may have run on the server
	var err error
	for range r.tries {
		err = r.pool.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
		if err == nil {
			r.ranBefore = ran
			return nil
		}
		if r.ctx.Err() != nil || !brokenSession(err) {
			break
		}
		ran = ran || mayHaveRun(err)
	}
	r.ranBefore = ran
	if ran && !mayHaveRun(err) {
		// The last try was not sent, but an earlier one may have run: the
		// caller must treat the outcome as unknown, not as refused.
		return &sentError{err: err}
	}
	return err
}

// sentError is the error of a statement that may have run in an earlier
// try whose reply was lost, although its last try failed before sending.
type sentError struct{ err error }

func (e *sentError) Error() string {
	return "the reply of an earlier try was lost, then: " + e.err.Error()
}

func (e *sentError) Unwrap() error { return e.err }

// brokenSession reports whether err says the session broke rather than
// answered: a FATAL or PANIC reply (the server ended the session), a
// failure pgx knows happened before anything was sent, or a network error
// or end of stream while the statement was in flight.
func brokenSession(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if s, ok := serverError(err); ok {
		return s.Final
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}
