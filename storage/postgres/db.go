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

// TxBeginner starts a transaction with options such as the isolation level.
// *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
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
	_ TxBeginner = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgx.Conn)(nil)
	_ Batcher    = (*pgxpool.Pool)(nil)
	_ Batcher    = (*pgx.Conn)(nil)
	_ Batcher    = pgx.Tx(nil)
)
