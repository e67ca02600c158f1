package workload

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// The counters live in a table of their own; the guard table comes from
// migrations.UpMySQL, which must have been applied.
const (
	myCreate = `CREATE TABLE IF NOT EXISTS fencekit_workload (
	resource VARBINARY(1024) PRIMARY KEY,
	n BIGINT NOT NULL,
	last_token BIGINT NOT NULL)`
	mySeed   = `INSERT IGNORE INTO fencekit_workload (resource, n, last_token) VALUES (?, 0, 0)`
	mySelect = `SELECT n, last_token FROM fencekit_workload WHERE resource = ?`
	myUpdate = `UPDATE fencekit_workload SET n = ?, last_token = ? WHERE resource = ?`
)

// MySQLCounter keeps counters in a MySQL or MariaDB table, fenced by the
// guard table: a fenced read and a fenced write are each a guarded
// transaction.
type MySQLCounter struct {
	DB *sql.DB
	// Levels, when set, are the isolation levels a fenced read or write
	// runs at, one drawn for each transaction; sql.LevelDefault (or none)
	// is the session's.
	Levels []sql.IsolationLevel
	// Default names the sessions' default level, for the counts per
	// level. default: "default"
	Default string

	counts levelCounts
}

// Refused reports a deadlock or a lock wait timeout: the transaction
// rolled back, nothing changed.
func (c *MySQLCounter) Refused(err error) bool { return errors.Is(err, mysql.ErrRetryable) }

// LevelCounts counts the fenced transactions per isolation level.
func (c *MySQLCounter) LevelCounts() map[string]LevelCount { return c.counts.snapshot() }

// txLevel draws a transaction's level: its options and its name.
func (c *MySQLCounter) txLevel() (*sql.TxOptions, string) { return drawSQLLevel(c.Levels, c.Default) }

// drawSQLLevel draws a database/sql transaction's level from levels (none,
// or sql.LevelDefault: the session's, named def or "default"): its options
// and its name.
func drawSQLLevel(levels []sql.IsolationLevel, def string) (*sql.TxOptions, string) {
	name := def
	if name == "" {
		name = "default"
	}
	if len(levels) == 0 {
		return nil, name
	}
	l := levels[rand.IntN(len(levels))]
	if l == sql.LevelDefault {
		return nil, name
	}
	return &sql.TxOptions{Isolation: l}, strings.ToLower(l.String())
}

// Name names the storage.
func (c *MySQLCounter) Name() string { return "mysql" }

// Setup creates the counter table and a zero row per resource.
func (c *MySQLCounter) Setup(ctx context.Context, _ Mode, resources []string) error {
	if _, err := c.DB.ExecContext(ctx, myCreate); err != nil {
		return err
	}
	for _, r := range resources {
		if _, err := c.DB.ExecContext(ctx, mySeed, r); err != nil {
			return err
		}
	}
	return nil
}

// Read guards f and selects in one transaction in Fenced mode; it selects
// alone otherwise.
func (c *MySQLCounter) Read(ctx context.Context, mode Mode, f fence.Fence, resource string) (State, error) {
	var s State
	if mode != Fenced {
		err := c.DB.QueryRowContext(ctx, mySelect, resource).Scan(&s.N, &s.Last)
		return s, err
	}
	opts, level := c.txLevel()
	err := mysql.InTx(ctx, c.DB, opts, f, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, mySelect, resource).Scan(&s.N, &s.Last)
	})
	c.counts.note(level, err, mysql.ErrRetryable)
	return s, err
}

// Write guards f and updates in one transaction in the fenced modes; it
// updates alone in Plain mode.
func (c *MySQLCounter) Write(ctx context.Context, mode Mode, f fence.Fence, resource string, s State) error {
	if mode == Plain {
		_, err := c.DB.ExecContext(ctx, myUpdate, s.N, int64(s.Last), resource)
		return err
	}
	opts, level := c.txLevel()
	err := mysql.InTx(ctx, c.DB, opts, f, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, myUpdate, s.N, int64(s.Last), resource)
		if err != nil {
			return err
		}
		// last_token changes with every admitted write's token, so a
		// matched row is a changed row.
		if n, err := res.RowsAffected(); err == nil && n != 1 {
			return errors.New("workload: counter row missing")
		}
		return err
	})
	c.counts.note(level, err, mysql.ErrRetryable)
	return err
}

// Final selects the counter without a fence.
func (c *MySQLCounter) Final(ctx context.Context, _ Mode, resource string) (State, error) {
	return c.Read(ctx, Plain, fence.Fence{}, resource)
}
