package workload

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// PgsqlCounter keeps counters in the PostgreSQL table PostgresCounter
// uses, fenced through database/sql (storage/pgsql): a fenced read and a
// fenced write are each a guarded transaction, half of them pgsql.InTx's
// and half the caller's own with pgsql.Guard as its first statement (the
// judge statement, pgcore's GuardJudgeSQL, which InTx does not send).
type PgsqlCounter struct {
	DB *sql.DB
	// Levels, when set, are the isolation levels a fenced read or write
	// runs at, one drawn for each transaction; sql.LevelDefault (or none)
	// is the database's.
	Levels []sql.IsolationLevel
	// Default names the database's default level, for the counts per
	// level. default: "default"
	Default string
	// HoldInTx, when positive, keeps half the fenced writes' transactions
	// open after their guard, for a while drawn up to it, before the
	// update: a slow writer that holds its guard row while the next
	// holder's transaction begins (and takes its snapshot) behind it.
	HoldInTx time.Duration

	counts levelCounts
}

// Refused reports a serialization failure or a deadlock: the transaction
// rolled back, nothing changed.
func (c *PgsqlCounter) Refused(err error) bool { return errors.Is(err, pgsql.ErrRetryable) }

// LevelCounts counts the fenced transactions per isolation level.
func (c *PgsqlCounter) LevelCounts() map[string]LevelCount { return c.counts.snapshot() }

// Name names the storage.
func (c *PgsqlCounter) Name() string { return "pgsql" }

// Setup creates the counter table and a zero row per resource.
func (c *PgsqlCounter) Setup(ctx context.Context, _ Mode, resources []string) error {
	if _, err := c.DB.ExecContext(ctx, pgCreate); err != nil {
		return err
	}
	for _, r := range resources {
		if _, err := c.DB.ExecContext(ctx, pgSeed, r); err != nil {
			return err
		}
	}
	return nil
}

// Read guards f and selects in one transaction in Fenced mode; it selects
// alone otherwise.
func (c *PgsqlCounter) Read(ctx context.Context, mode Mode, f fence.Fence, resource string) (State, error) {
	var s State
	if mode != Fenced {
		err := c.DB.QueryRowContext(ctx, pgSelect, resource).Scan(&s.N, &s.Last)
		return s, err
	}
	opts, level := drawSQLLevel(c.Levels, c.Default)
	err := c.inTx(ctx, opts, f, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, pgSelect, resource).Scan(&s.N, &s.Last)
	})
	c.counts.note(level, err, pgsql.ErrRetryable)
	return s, err
}

// Write guards f and updates in one transaction in the fenced modes; it
// updates alone in Plain mode.
func (c *PgsqlCounter) Write(ctx context.Context, mode Mode, f fence.Fence, resource string, s State) error {
	if mode == Plain {
		_, err := c.DB.ExecContext(ctx, pgUpdate, resource, s.N, int64(s.Last))
		return err
	}
	opts, level := drawSQLLevel(c.Levels, c.Default)
	err := c.inTx(ctx, opts, f, func(ctx context.Context, tx *sql.Tx) error {
		if c.HoldInTx > 0 && rand.IntN(2) == 0 {
			time.Sleep(rand.N(c.HoldInTx))
		}
		res, err := tx.ExecContext(ctx, pgUpdate, resource, s.N, int64(s.Last))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n != 1 {
			return errors.New("workload: counter row missing")
		}
		return err
	})
	c.counts.note(level, err, pgsql.ErrRetryable)
	return err
}

// Final selects the counter without a fence.
func (c *PgsqlCounter) Final(ctx context.Context, _ Mode, resource string) (State, error) {
	return c.Read(ctx, Plain, fence.Fence{}, resource)
}

// inTx runs fn in a transaction guarded by f: pgsql.InTx's, or (one in
// two) the caller's own, begun here with pgsql.Guard as its first
// statement; a serialization failure or deadlock of the own transaction's
// later statements or commit matches pgsql.ErrRetryable, as InTx's do.
func (c *PgsqlCounter) inTx(ctx context.Context, opts *sql.TxOptions, f fence.Fence, fn pgsql.TxFunc) error {
	if rand.IntN(2) == 0 {
		return pgsql.InTx(ctx, c.DB, opts, f, fn)
	}
	tx, err := c.DB.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := pgsql.Guard(ctx, tx, f); err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		return retryableAs(err)
	}
	return retryableAs(tx.Commit())
}

// retryableAs marks a serialization failure (40001) or deadlock (40P01)
// as pgsql.ErrRetryable.
func retryableAs(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") {
		return fmt.Errorf("%w: %w", pgsql.ErrRetryable, err)
	}
	return err
}
