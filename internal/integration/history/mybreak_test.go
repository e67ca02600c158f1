package history

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// The broken variants of the MySQL guard are built here, in test code: the
// statements the guard sends are changed in a database/sql connector that
// wraps the driver's (breakingConnector), and Once's order is replaced by
// a broken version of its own (myOnceAfterRun).

// myGuardPrefix starts Guard's upsert (storage/mysql's guardSQL), whose
// arguments begin with resource, token, holder; myAdmitPrefix starts the
// guard of InTx and Once on an existing guard row (admitSQL), whose
// arguments are token, token, holder, five more, then resource;
// myFollowPrefix starts their guard of the fence the process saw admitted
// last for the resource (followSQL), a locking read that judges the mark,
// whose arguments are token, token, holder, token, then resource.
const (
	myGuardPrefix  = "INSERT INTO fencekit_guard (resource, token, holder, updated_at)"
	myAdmitPrefix  = "UPDATE fencekit_guard\nSET admissions = IF("
	myAdmitArgs    = 10
	myFollowPrefix = "SELECT token, holder, IF("
	myFollowArgs   = 5
	myForUpdate    = " FOR UPDATE"
)

// breakingConnector opens connections whose statements are changed by
// breaks before they are prepared; with unlocked set, the guard's upsert
// runs as unlockedStmt. It counts the statements it changed in swapped,
// and the guards by followSQL it saw in follows (with no break and no flag
// it changes nothing: the sound run counts them too).
// Its connections offer no direct Exec or Query, so that database/sql
// prepares every statement and each passes here.
type breakingConnector struct {
	driver.Connector
	breaks   []sqlBreak
	unlocked bool
	// judgeUnlocked: storage/mysql's guard of InTx and Once judges the
	// mark from the transaction's snapshot (mySnapshotStmt).
	judgeUnlocked             bool
	swapped, exposed, follows *atomic.Int64
}

func (c breakingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &breakingConn{conn: conn, c: c}, nil
}

func (c breakingConnector) rewrite(q string) string {
	for _, b := range c.breaks {
		if strings.Contains(q, b.old) {
			q = strings.ReplaceAll(q, b.old, b.new)
			c.swapped.Add(1)
		}
	}
	return q
}

type breakingConn struct {
	conn driver.Conn
	c    breakingConnector
}

var (
	_ driver.ConnPrepareContext = (*breakingConn)(nil)
	_ driver.ConnBeginTx        = (*breakingConn)(nil)
	_ driver.SessionResetter    = (*breakingConn)(nil)
	_ driver.Validator          = (*breakingConn)(nil)
	_ driver.NamedValueChecker  = (*breakingConn)(nil)
	_ driver.Pinger             = (*breakingConn)(nil)
)

func (b *breakingConn) Prepare(q string) (driver.Stmt, error) {
	return b.PrepareContext(context.Background(), q)
}

func (b *breakingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if strings.HasPrefix(q, myFollowPrefix) {
		b.c.follows.Add(1)
		if b.c.unlocked || b.c.judgeUnlocked {
			// The guard's locking read, sent as a plain one: it judges
			// the transaction's snapshot, and the unlocked variant never
			// locks the row.
			b.c.swapped.Add(1)
			return myPlainFollowStmt{b: b, q: b.c.rewrite(strings.Replace(q, myForUpdate, "", 1)), lockAfter: b.c.judgeUnlocked}, nil
		}
	}
	if b.c.unlocked && (strings.HasPrefix(q, myGuardPrefix) || strings.HasPrefix(q, myAdmitPrefix)) {
		b.c.swapped.Add(1)
		return unlockedStmt{b: b, admit: strings.HasPrefix(q, myAdmitPrefix)}, nil
	}
	if b.c.judgeUnlocked && strings.HasPrefix(q, myAdmitPrefix) {
		b.c.swapped.Add(1)
		return mySnapshotStmt{b: b, q: q}, nil
	}
	return b.conn.(driver.ConnPrepareContext).PrepareContext(ctx, b.c.rewrite(q))
}

func (b *breakingConn) Close() error { return b.conn.Close() }

//nolint:staticcheck // driver.Conn requires Begin.
func (b *breakingConn) Begin() (driver.Tx, error) {
	return b.BeginTx(context.Background(), driver.TxOptions{})
}

func (b *breakingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return b.conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (b *breakingConn) Ping(ctx context.Context) error { return b.conn.(driver.Pinger).Ping(ctx) }

func (b *breakingConn) ResetSession(ctx context.Context) error {
	return b.conn.(driver.SessionResetter).ResetSession(ctx)
}

func (b *breakingConn) IsValid() bool { return b.conn.(driver.Validator).IsValid() }

func (b *breakingConn) CheckNamedValue(v *driver.NamedValue) error {
	return b.conn.(driver.NamedValueChecker).CheckNamedValue(v)
}

// query runs q on the wrapped connection and returns its rows.
func (b *breakingConn) query(ctx context.Context, q string, args ...any) ([][]driver.Value, error) {
	st, err := b.conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, named(args))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]driver.Value
	for {
		row := make([]driver.Value, len(rows.Columns()))
		if err := rows.Next(row); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
}

func (b *breakingConn) exec(ctx context.Context, q string, args ...any) (driver.Result, error) {
	st, err := b.conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return st.(driver.StmtExecContext).ExecContext(ctx, named(args))
}

func named(args []any) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return nv
}

// unlockedStmt is the broken guard of the row-lock control: it reads the
// mark without locking it, decides by the fence rule in the client, and
// then writes the mark unconditionally. Another holder can be admitted
// between the read and the write, which then lowers the mark. It answers
// as the guard's upsert does: rows changed when admitted, none when stale
// (the guard then reads the mark it lost to). In admitSQL's place it
// answers as admitSQL does, in the insert id, and admits a fence that holds
// the mark as read without writing anything. It counts in exposed the marks
// it overwrote that were newer than its fence, and the admissions of a
// fence holding the mark as read that the locked row refutes.
type unlockedStmt struct {
	b     *breakingConn
	admit bool // admitSQL's form: an existing row only
}

func (s unlockedStmt) Close() error  { return nil }
func (s unlockedStmt) NumInput() int { return -1 }

func (s unlockedStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: unlockedStmt needs ExecContext")
}

func (s unlockedStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: unlockedStmt does not query")
}

func (s unlockedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	res, _ := args[0].Value.(string)
	tok, _ := args[1].Value.(int64)
	holder, _ := args[2].Value.(string)
	if s.admit {
		res, _ = args[myAdmitArgs-1].Value.(string)
		tok, _ = args[0].Value.(int64)
		holder, _ = args[2].Value.(string)
	}
	rows, err := s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ?", res)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 && s.admit {
		return guardAnswer{}, nil // no row: the guard creates it and begins again
	}
	if len(rows) == 1 {
		mt, mh := asInt(rows[0][0]), asString(rows[0][1])
		switch {
		case !(tok > mt || (tok == mt && holder == mh)):
			if s.admit {
				return guardAnswer{id: 2}, nil
			}
			return driver.RowsAffected(0), nil
		case s.admit && tok == mt:
			// The mark holds the fence, as read: admitted, nothing written.
			// The test looks (locking) to count an admission that the row
			// refutes; the guard does not use it.
			marks, err := s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ? FOR UPDATE", res)
			if err != nil {
				return nil, err
			}
			if len(marks) == 1 && (asInt(marks[0][0]) != tok || asString(marks[0][1]) != holder) {
				s.b.c.exposed.Add(1)
			}
			return guardAnswer{id: 1}, nil
		}
	}
	// A client pays a round trip between its read and its write, and may
	// be slow to send the write: up to 20 ms here.
	time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
	// The test looks (locking, as the write would) to count a write that
	// goes wrong; the write does not use it.
	rows, err = s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ? FOR UPDATE", res)
	if err != nil {
		return nil, err
	}
	if len(rows) == 1 {
		mt, mh := asInt(rows[0][0]), asString(rows[0][1])
		if mt > tok || (mt == tok && mh != holder) {
			s.b.c.exposed.Add(1)
		}
	}
	if s.admit {
		if _, err := s.b.exec(ctx, "UPDATE fencekit_guard SET admissions = admissions + 1, updated_at = UTC_TIMESTAMP(6), holder = ?, token = ? WHERE resource = ?",
			holder, tok, res); err != nil {
			return nil, err
		}
		return guardAnswer{id: 3, n: 1}, nil
	}
	return s.b.exec(ctx, "INSERT INTO fencekit_guard (resource, token, holder, updated_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))\n"+
		"ON DUPLICATE KEY UPDATE admissions = admissions + 1, updated_at = UTC_TIMESTAMP(6), token = ?, holder = ?", res, tok, holder, tok, holder)
}

func asInt(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case []byte:
		var n int64
		for _, c := range x {
			n = n*10 + int64(c-'0')
		}
		return n
	}
	return 0
}

func asString(v driver.Value) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	}
	return ""
}

// mySnapshotStmt is the guard of InTx and Once judging the fence from the
// transaction's snapshot: a plain read of the mark, which does not wait for
// a newer holder's transaction that holds the row. A fence that the
// snapshot shows holding the mark is admitted, after the row is locked
// (without looking at it again); one the snapshot refuses is refused; one
// it shows newer runs admitSQL itself, which judges the row it locks (so
// that a mark is never lowered). It answers as admitSQL does, in the insert
// id, and counts in exposed the admissions that the locked row refutes.
type mySnapshotStmt struct {
	b *breakingConn
	q string // admitSQL
}

func (s mySnapshotStmt) Close() error  { return nil }
func (s mySnapshotStmt) NumInput() int { return -1 }

func (s mySnapshotStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: mySnapshotStmt needs ExecContext")
}

func (s mySnapshotStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: mySnapshotStmt does not query")
}

func (s mySnapshotStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if len(args) != myAdmitArgs {
		return nil, errors.New("history: admitSQL's arguments changed")
	}
	tok, holder, res := asInt(args[0].Value), asString(args[2].Value), asString(args[myAdmitArgs-1].Value)
	rows, err := s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ?", res)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return guardAnswer{}, nil // no row: the guard creates it and begins again
	}
	mt, mh := asInt(rows[0][0]), asString(rows[0][1])
	switch {
	case tok == mt && holder == mh:
		marks, err := s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ? FOR UPDATE", res)
		if err != nil {
			return nil, err
		}
		if len(marks) == 1 && (asInt(marks[0][0]) != tok || asString(marks[0][1]) != holder) {
			s.b.c.exposed.Add(1)
		}
		return guardAnswer{id: 1}, nil
	case tok > mt:
		vals := make([]any, len(args))
		for i, a := range args {
			vals[i] = a.Value
		}
		return s.b.exec(ctx, s.q, vals...)
	}
	return guardAnswer{id: 2}, nil
}

// myPlainFollowStmt is followSQL (q) without FOR UPDATE: it judges the
// fence from the transaction's snapshot (a plain read, which does not wait
// for a newer holder's transaction that holds the row). With lockAfter
// (the snapshot variant) a fence it shows holding the mark is admitted
// after the row is locked, without looking at the row again; it counts in
// exposed the admissions that the locked row refutes. Without it (the
// unlocked variant) the row is never locked.
type myPlainFollowStmt struct {
	b         *breakingConn
	q         string
	lockAfter bool
}

func (s myPlainFollowStmt) Close() error  { return nil }
func (s myPlainFollowStmt) NumInput() int { return -1 }

func (s myPlainFollowStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("history: myPlainFollowStmt does not exec")
}

func (s myPlainFollowStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("history: myPlainFollowStmt needs QueryContext")
}

func (s myPlainFollowStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if len(args) != myFollowArgs {
		return nil, errors.New("history: followSQL's arguments changed")
	}
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	rows, err := s.b.query(ctx, s.q, vals...)
	if err != nil {
		return nil, err
	}
	if s.lockAfter && len(rows) == 1 && asInt(rows[0][2]) == 1 {
		tok, holder, res := asInt(args[0].Value), asString(args[2].Value), asString(args[myFollowArgs-1].Value)
		marks, err := s.b.query(ctx, "SELECT token, holder FROM fencekit_guard WHERE resource = ? FOR UPDATE", res)
		if err != nil {
			return nil, err
		}
		if len(marks) == 1 && (asInt(marks[0][0]) != tok || asString(marks[0][1]) != holder) {
			s.b.c.exposed.Add(1)
		}
	}
	return &valueRows{cols: []string{"token", "holder", "answer"}, rows: rows}, nil
}

// valueRows are rows read already.
type valueRows struct {
	cols []string
	rows [][]driver.Value
}

func (r *valueRows) Columns() []string { return r.cols }
func (r *valueRows) Close() error      { return nil }

func (r *valueRows) Next(dest []driver.Value) error {
	if len(r.rows) == 0 {
		return io.EOF
	}
	copy(dest, r.rows[0])
	r.rows = r.rows[1:]
	return nil
}

// guardAnswer is a statement's answer: its insert id and affected rows.
type guardAnswer struct{ id, n int64 }

func (a guardAnswer) LastInsertId() (int64, error) { return a.id, nil }
func (a guardAnswer) RowsAffected() (int64, error) { return a.n, nil }

// myOnceAfterRun is the broken Once of its control, as onceAfter is for
// PostgreSQL: the work in one guarded transaction, its record after, in
// another. It counts in exposed the runs whose record was found taken
// after the work had committed.
func myOnceAfterRun(ctx context.Context, db *sql.DB, f fence.Fence, key string, fn mysql.TxFunc, exposed *atomic.Int64) (bool, error) {
	var done bool
	err := mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM fencekit_once WHERE `key` = ?", key).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fn(ctx, tx)
		}
		done = err == nil
		return err
	})
	if err != nil || done {
		return false, err
	}
	claimed := false
	err = mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "INSERT IGNORE INTO fencekit_once (`key`, resource, token, holder, done_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))",
			key, f.Resource, int64(f.Token), f.Holder)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err == nil && n == 0 {
			exposed.Add(1)
		}
		claimed = n > 0
		return err
	})
	return claimed, err
}
