package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it;
// pass a pgx.Tx to make a call part of your transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts a transaction (or, on a pgx.Tx, a savepoint).
// *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txBeginner starts a transaction with options such as the isolation level:
// InTx with non-zero options needs it (*pgxpool.Pool and *pgx.Conn have it).
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Batcher sends a pipelined batch of statements. *pgxpool.Pool, *pgx.Conn
// and pgx.Tx satisfy it.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ Querier    = (*pgxpool.Pool)(nil)
	_ Querier    = (*pgx.Conn)(nil)
	_ Querier    = pgx.Tx(nil)
	_ Beginner   = (*pgxpool.Pool)(nil)
	_ Beginner   = (*pgx.Conn)(nil)
	_ Beginner   = pgx.Tx(nil)
	_ txBeginner = (*pgxpool.Pool)(nil)
	_ txBeginner = (*pgx.Conn)(nil)
	_ Batcher    = (*pgxpool.Pool)(nil)
	_ Batcher    = (*pgx.Conn)(nil)
	_ Batcher    = pgx.Tx(nil)
	_ Querier    = (*pgxpool.Conn)(nil)
	_ Batcher    = (*pgxpool.Conn)(nil)
)

// acquirer is a pool: the calls below take one of its connections for their
// whole duration rather than let the pool acquire one per statement.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// onConn runs fn with db or, when db is a pool, with a connection acquired
// from it, which goes back to the pool when fn returns or panics. Encoding a
// statement's arguments runs user code (a Value or Encode method), and
// pgxpool's SendBatch and QueryRow keep the connection they acquired when
// that code panics; holding the connection here returns it (or closes it, if
// the panic left it busy) whatever happens.
func onConn[T any](ctx context.Context, db T, fn func(T) error) error {
	p, ok := any(db).(acquirer)
	if !ok {
		return fn(db)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		return prefixed("postgres: acquire a connection", err)
	}
	defer c.Release()
	conn, ok := any(c).(T)
	if !ok {
		// Unreachable for the interfaces of this package; fall back to the
		// pool rather than fail.
		c.Release()
		return fn(db)
	}
	return fn(conn)
}
