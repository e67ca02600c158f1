package pglock

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/pgcore"
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

// QueryRow runs a statement that must not be left undone by a timeout the
// database or role sets (a release): one cut by statement_timeout or
// lock_timeout is sent again in a transaction that lifts them.
func (r retrying) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &retryRow{pool: r.pool, tries: r.tries, ctx: ctx, sql: sql, args: args, lift: true}
}

// grantRow runs a grant: a timeout the database or role sets is the
// caller's error (nothing was granted), not lifted.
func (r retrying) grantRow(ctx context.Context, sql string, args ...any) pgx.Row {
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
	// lift: a statement cut by a timeout the database or role sets is
	// sent again with the timeouts lifted.
	lift bool
}

// Transaction settings. A statement of the lock's runs alone, in a
// transaction of its own, at the database's or role's defaults; it needs
// READ COMMITTED (its functions lock a row and read its newest version,
// and wait for one another rather than fail). At REPEATABLE READ or
// SERIALIZABLE, a statement that met a concurrent change fails with a
// serialization failure having changed nothing: it is sent again in a
// transaction of its own at READ COMMITTED, which costs the round trips of
// BEGIN and COMMIT only then.
const (
	// isolatedTries bounds the tries in a READ COMMITTED transaction (a
	// deadlock detected among the lock's own statements can fail one).
	isolatedTries = 5
	// liftTimeoutsSQL lifts the timeouts a database or role may set, for
	// the rest of the transaction it runs in.
	liftTimeoutsSQL = `SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true)`
)

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
	if r.ctx.Err() == nil && (serialization(err) || r.lift && cutByTimeout(err)) {
		// Nothing ran: the statement was aborted. Again at READ
		// COMMITTED, the timeouts lifted where they must not cut it.
		for range isolatedTries {
			err = r.isolated(dest...)
			if err == nil || r.ctx.Err() != nil || !serialization(err) {
				break
			}
		}
		if err == nil {
			return nil
		}
	}
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

// isolated runs the statement in a READ COMMITTED transaction of its own,
// lifting the database's timeouts first when r.lift.
func (r *retryRow) isolated(dest ...any) error {
	tx, err := r.pool.BeginTx(r.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(r.ctx)) }()
	if r.lift {
		if _, err := tx.Exec(r.ctx, liftTimeoutsSQL); err != nil {
			return err
		}
	}
	if err := tx.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...); err != nil {
		return err
	}
	return tx.Commit(r.ctx)
}

// serialization reports whether err is a serialization failure or a
// deadlock: the statement was aborted, and may be sent again.
func serialization(err error) bool {
	s, ok := serverError(err)
	return ok && (s.Code == pgcore.CodeSerializationFailure || s.Code == pgcore.CodeDeadlockDetected)
}

// Codes of a statement cut by a timeout.
const (
	codeQueryCanceled    = "57014" // statement_timeout (or a cancel request)
	codeLockNotAvailable = "55P03" // lock_timeout
)

// cutByTimeout reports whether err says statement_timeout or lock_timeout
// cut the statement (which then changed nothing).
func cutByTimeout(err error) bool {
	s, ok := serverError(err)
	return ok && (s.Code == codeQueryCanceled && strings.Contains(s.Message, "timeout") || s.Code == codeLockNotAvailable)
}
