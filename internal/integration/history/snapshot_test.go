package history

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// The snapshot controls' broken guards: each locks the guard row but judges
// the holder of the mark from what its statement's snapshot shows, which,
// when the statement waited for a newer holder's transaction, is the mark
// from before that holder raised it. Each counts in exposed the admissions
// that the locked row refutes (read with a locking read after the broken
// guard decided; the guard does not use it).

// pgSnapshotGuardSQL is the broken PostgreSQL guard statement: its upsert
// locks the row and raises a lower mark, but the fence that holds the mark
// is admitted by a subquery, which reads the statement's snapshot.
const pgSnapshotGuardSQL = `WITH raised AS (
    INSERT INTO fencekit_guard AS g (resource, token, holder)
    VALUES ($1, $2, $3)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
        WHERE EXCLUDED.token > g.token
    RETURNING true
)
SELECT true FROM raised
UNION ALL
SELECT true FROM fencekit_guard AS g WHERE g.resource = $1 AND g.token = $2 AND g.holder = $3`

// pgLockedMarkSQL reads a resource's mark with a locking read: the newest
// committed one (the controls count their exposures with it).
const pgLockedMarkSQL = `SELECT token, holder FROM fencekit_guard WHERE resource = $1 FOR UPDATE`

// snapshotGuard runs pgSnapshotGuardSQL in tx, for storage/postgres, and
// answers as the guard does: a row (true) when admitted, none when stale.
func snapshotGuard(ctx context.Context, tx pgx.Tx, res string, tok int64, holder string, exposed *atomic.Int64) pgx.Row {
	var admitted bool
	err := tx.QueryRow(ctx, pgSnapshotGuardSQL, res, tok, holder).Scan(&admitted)
	if err != nil {
		return errRow{err}
	}
	var mt int64
	var mh string
	if err := tx.QueryRow(ctx, pgLockedMarkSQL, res).Scan(&mt, &mh); err == nil && (mt != tok || mh != holder) {
		exposed.Add(1)
	}
	return errRow{nil}
}

// pgsqlSnapshotStmt is snapshotGuard for storage/pgsql.
type pgsqlSnapshotStmt struct{ b *breakingConn }

func (s pgsqlSnapshotStmt) Close() error  { return nil }
func (s pgsqlSnapshotStmt) NumInput() int { return -1 }

func (s pgsqlSnapshotStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: pgsqlSnapshotStmt does not exec")
}

func (s pgsqlSnapshotStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: pgsqlSnapshotStmt needs QueryContext")
}

func (s pgsqlSnapshotStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	res, tok, holder := asString(args[0].Value), asInt(args[1].Value), asString(args[2].Value)
	rows, err := s.b.query(ctx, pgSnapshotGuardSQL, res, tok, holder)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return &boolRows{}, nil
	}
	marks, err := s.b.query(ctx, pgLockedMarkSQL, res)
	if err == nil && len(marks) == 1 && (asInt(marks[0][0]) != tok || asString(marks[0][1]) != holder) {
		s.b.c.exposed.Add(1)
	}
	return &boolRows{n: 1}, nil
}
