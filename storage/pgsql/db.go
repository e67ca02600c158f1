package pgsql

import (
	"context"
	"database/sql"
)

// Querier runs statements. *sql.DB, *sql.Conn and *sql.Tx satisfy it; pass
// a *sql.Tx to make a call part of your transaction.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Conn)(nil)
	_ Querier = (*sql.Tx)(nil)
)
