package history

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// The broken variants of storage/pgsql's guards are built here, in test
// code: its statements, which are storage/postgres's (pgBreaks), are
// changed in the database/sql connector wrapper of the MySQL controls
// (breakingConnector), and the row lock and Once's order are replaced by
// broken versions of their own (pgsqlUnlockedStmt, pgsqlOnceAfter).

// pgsqlConnector is breakingConnector for the PostgreSQL drivers: with
// unlocked set, the guard's upsert (pgGuardPrefix) runs as
// pgsqlUnlockedStmt.
type pgsqlConnector struct {
	breakingConnector
	unlocked bool
	snapshot bool // the guard statement runs as pgsqlSnapshotStmt
}

func (c pgsqlConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.breakingConnector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return pgsqlConn{breakingConn: conn.(*breakingConn), unlocked: c.unlocked, snapshot: c.snapshot}, nil
}

type pgsqlConn struct {
	*breakingConn
	unlocked bool
	snapshot bool
}

func (b pgsqlConn) Prepare(q string) (driver.Stmt, error) {
	return b.PrepareContext(context.Background(), q)
}

func (b pgsqlConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if (b.unlocked || b.snapshot) && (strings.HasPrefix(q, pgAdmitPrefix) || q == pgcore.GuardAdmitLockedSQL) {
		// InTx and Once send the raising guard (on pgx's stdlib with its
		// statement cache, its fast path first): the same
		// broken guard, answering as fencekit_guard_admit does.
		b.c.swapped.Add(1)
		var inner driver.StmtQueryContext = pgsqlSnapshotStmt{b: b.breakingConn}
		if b.unlocked {
			inner = pgsqlUnlockedStmt{b: b.breakingConn}
		}
		return pgsqlAdmitStmt{b: b.breakingConn, guard: inner}, nil
	}
	if b.unlocked && strings.HasPrefix(q, pgGuardPrefix) {
		b.c.swapped.Add(1)
		return pgsqlUnlockedStmt{b: b.breakingConn}, nil
	}
	if b.snapshot && strings.HasPrefix(q, pgGuardPrefix) {
		b.c.swapped.Add(1)
		return pgsqlSnapshotStmt{b: b.breakingConn}, nil
	}
	return b.breakingConn.PrepareContext(ctx, q)
}

// The methods the two drivers do not share defer to the driver's, or do
// what database/sql does without them.

func (b pgsqlConn) CheckNamedValue(v *driver.NamedValue) error {
	if c, ok := b.conn.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (b pgsqlConn) IsValid() bool {
	if c, ok := b.conn.(driver.Validator); ok {
		return c.IsValid()
	}
	return true
}

func (b pgsqlConn) ResetSession(ctx context.Context) error {
	if c, ok := b.conn.(driver.SessionResetter); ok {
		return c.ResetSession(ctx)
	}
	return nil
}

func (b pgsqlConn) Ping(ctx context.Context) error {
	if c, ok := b.conn.(driver.Pinger); ok {
		return c.Ping(ctx)
	}
	return nil
}

// pgsqlUnlockedStmt is the broken guard of the row-lock control, as
// unlockedGuard is for storage/postgres: it reads the mark without locking
// it, decides by the fence rule in the client, then writes the mark
// unconditionally, and answers as the guard's upsert does (a row when
// admitted, none when stale). It counts in exposed the marks it overwrote
// that were newer than its fence.
type pgsqlUnlockedStmt struct{ b *breakingConn }

func (s pgsqlUnlockedStmt) Close() error  { return nil }
func (s pgsqlUnlockedStmt) NumInput() int { return -1 }

func (s pgsqlUnlockedStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: pgsqlUnlockedStmt does not exec")
}

func (s pgsqlUnlockedStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: pgsqlUnlockedStmt needs QueryContext")
}

func (s pgsqlUnlockedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	res, tok, holder := asString(args[0].Value), asInt(args[1].Value), asString(args[2].Value)
	rows, err := s.b.query(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1`, res)
	if err != nil {
		return nil, err
	}
	if len(rows) == 1 {
		mt, mh := asInt(rows[0][0]), asString(rows[0][1])
		if !(tok > mt || (tok == mt && holder == mh)) {
			return &boolRows{}, nil
		}
	}
	// A client pays a round trip between its read and its write, and may
	// be slow to send the write: up to 20 ms here.
	time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
	// The test looks (locking, as the write would) to count a write that
	// goes wrong; the write does not use it.
	rows, err = s.b.query(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1 FOR UPDATE`, res)
	if err != nil {
		return nil, err
	}
	if len(rows) == 1 {
		mt, mh := asInt(rows[0][0]), asString(rows[0][1])
		if mt > tok || (mt == tok && mh != holder) {
			s.b.c.exposed.Add(1)
		}
	}
	if _, err := s.b.exec(ctx, `INSERT INTO fencekit_guard AS g (resource, token, holder) VALUES ($1, $2, $3)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder`, res, tok, holder); err != nil {
		return nil, err
	}
	return &boolRows{n: 1}, nil
}

// pgsqlAdmitStmt runs a broken guard (pgsqlUnlockedStmt,
// pgsqlSnapshotStmt) in place of fencekit_guard_admit and answers as that
// function does: nothing when admitted, SQLSTATE FK001 with the mark in
// DETAIL when stale.
type pgsqlAdmitStmt struct {
	b     *breakingConn
	guard driver.StmtQueryContext
}

func (s pgsqlAdmitStmt) Close() error  { return nil }
func (s pgsqlAdmitStmt) NumInput() int { return -1 }

func (s pgsqlAdmitStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: pgsqlAdmitStmt needs ExecContext")
}

func (s pgsqlAdmitStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: pgsqlAdmitStmt does not query")
}

func (s pgsqlAdmitStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	rows, err := s.guard.QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	admitted := rows.Next(make([]driver.Value, 1)) == nil
	_ = rows.Close()
	if admitted {
		return driver.RowsAffected(1), nil
	}
	marks, err := s.b.query(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1`, asString(args[0].Value))
	if err != nil || len(marks) != 1 {
		return nil, fmt.Errorf("history: the mark of a refused guard: %v (%d rows)", err, len(marks))
	}
	detail, _ := json.Marshal(map[string]any{"token": asInt(marks[0][0]), "holder": asString(marks[0][1])})
	return nil, &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "FK001", Message: "stale fence", Detail: string(detail)}
}

// boolRows is n rows (0 or 1) of one column holding true.
type boolRows struct{ n, done int }

func (r *boolRows) Columns() []string { return []string{"bool"} }
func (r *boolRows) Close() error      { return nil }

func (r *boolRows) Next(dest []driver.Value) error {
	if r.done >= r.n {
		return io.EOF
	}
	r.done++
	dest[0] = true
	return nil
}

// pgsqlOnceAfter is the broken Once of its control, as onceAfter is for
// storage/postgres: the work in one guarded transaction, its record after,
// in another. It counts in exposed the runs whose record was found taken
// after the work had committed.
func pgsqlOnceAfter(ctx context.Context, db *sql.DB, f fence.Fence, key string, fn pgsql.TxFunc, exposed *atomic.Int64) (bool, error) {
	var done bool
	err := pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT true FROM fencekit_once WHERE key = $1`, key).Scan(&done)
		if errors.Is(err, sql.ErrNoRows) {
			done = false
			return fn(ctx, tx)
		}
		return err
	})
	if err != nil || done {
		return false, err
	}
	var claimed bool
	err = pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `INSERT INTO fencekit_once (key, resource, token, holder) VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO NOTHING RETURNING true`, key, f.Resource, int64(f.Token), f.Holder).Scan(&claimed)
		if errors.Is(err, sql.ErrNoRows) {
			exposed.Add(1)
			return nil
		}
		return err
	})
	return claimed, err
}

// dsnConnector opens connections of a driver that offers no connector of
// its own (lib/pq's Driver) by its Open.
type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }
