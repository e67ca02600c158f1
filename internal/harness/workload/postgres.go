package workload

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The counters live in a table of their own; the guard table comes from
// package migrations, which must have been applied.
const (
	pgCreate = `CREATE TABLE IF NOT EXISTS fencekit_workload (
	resource text PRIMARY KEY,
	n bigint NOT NULL,
	last_token bigint NOT NULL)`
	pgSeed   = `INSERT INTO fencekit_workload (resource, n, last_token) VALUES ($1, 0, 0) ON CONFLICT (resource) DO NOTHING`
	pgSelect = `SELECT n, last_token FROM fencekit_workload WHERE resource = $1`
	pgUpdate = `UPDATE fencekit_workload SET n = $2, last_token = $3 WHERE resource = $1`
)

// PostgresCounter keeps counters in a PostgreSQL table, fenced by the guard
// table: a fenced read is a guarded transaction, a fenced write one
// pipelined batch.
type PostgresCounter struct {
	Pool *pgxpool.Pool
	// Levels, when set, are the isolation levels a fenced read runs at,
	// one drawn for each; empty means the database's default.
	Levels []pgx.TxIsoLevel
	// Default names the database's default level, which the fenced
	// writes (one pipelined batch each) run at, for the counts per level.
	// default: "default"
	Default string

	counts levelCounts
}

// Refused reports a serialization failure or a deadlock: the transaction
// rolled back, nothing changed.
func (c *PostgresCounter) Refused(err error) bool { return errors.Is(err, postgres.ErrRetryable) }

// LevelCounts counts the fenced transactions per isolation level.
func (c *PostgresCounter) LevelCounts() map[string]LevelCount { return c.counts.snapshot() }

func (c *PostgresCounter) defaultLevel() string {
	if c.Default == "" {
		return "default"
	}
	return c.Default
}

// Name names the storage.
func (c *PostgresCounter) Name() string { return "postgres" }

// Setup creates the counter table and a zero row per resource.
func (c *PostgresCounter) Setup(ctx context.Context, _ Mode, resources []string) error {
	if _, err := c.Pool.Exec(ctx, pgCreate); err != nil {
		return err
	}
	for _, r := range resources {
		if _, err := c.Pool.Exec(ctx, pgSeed, r); err != nil {
			return err
		}
	}
	return nil
}

// Read guards f and selects in one transaction in Fenced mode; it selects
// alone otherwise.
func (c *PostgresCounter) Read(ctx context.Context, mode Mode, f fence.Fence, resource string) (State, error) {
	var s State
	if mode != Fenced {
		err := c.Pool.QueryRow(ctx, pgSelect, resource).Scan(&s.N, &s.Last)
		return s, err
	}
	var opts pgx.TxOptions
	level := c.defaultLevel()
	if len(c.Levels) > 0 {
		opts.IsoLevel = c.Levels[rand.IntN(len(c.Levels))]
		level = strings.ToLower(string(opts.IsoLevel))
	}
	err := postgres.InTx(ctx, c.Pool, opts, f, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, pgSelect, resource).Scan(&s.N, &s.Last)
	})
	c.counts.note(level, err, postgres.ErrRetryable)
	return s, err
}

// Write sends guard and update as one batch in the fenced modes; a plain
// UPDATE in Plain mode.
func (c *PostgresCounter) Write(ctx context.Context, mode Mode, f fence.Fence, resource string, s State) error {
	if mode == Plain {
		_, err := c.Pool.Exec(ctx, pgUpdate, resource, s.N, int64(s.Last))
		return err
	}
	tags, err := postgres.Exec(ctx, c.Pool, f, postgres.Statement{SQL: pgUpdate, Args: []any{resource, s.N, int64(s.Last)}})
	if err == nil && tags[0].RowsAffected() != 1 {
		return errors.New("workload: counter row missing")
	}
	c.counts.note(c.defaultLevel(), err, postgres.ErrRetryable)
	return err
}

// Final selects the counter without a fence.
func (c *PostgresCounter) Final(ctx context.Context, _ Mode, resource string) (State, error) {
	return c.Read(ctx, Plain, fence.Fence{}, resource)
}
