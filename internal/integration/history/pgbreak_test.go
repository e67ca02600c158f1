package history

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/storage/postgres"
)

// The broken variants of the PostgreSQL guards are built here, in test
// code: the guard's statements are rewritten on their way to the server
// (sqlBreak), the guard functions (the batch's fencekit_guard_admit, the
// transactions' fencekit_guard_try) are replaced in the test's own schema
// (breakAdmitFunction), and the row lock and Once's order are
// replaced by broken versions of their own (unlockedGuard, onceAfter).

// sqlBreak is one change to a statement the guards send: every statement
// holding old is sent with old replaced by new.
type sqlBreak struct{ old, new string }

// breakingDB is a pool whose statements, and those of the transactions it
// begins, are changed by breaks before they are sent; with unlocked set, a
// transaction's guard statement runs as unlockedGuard. It counts the
// statements it changed in swapped.
type breakingDB struct {
	*pgxpool.Pool
	breaks   []sqlBreak
	unlocked bool
	snapshot bool // the guard statement runs as snapshotGuard
	// functions: the guard functions are broken in the schema
	// (breakAdmitFunction), so a statement that calls one counts as changed.
	functions bool
	swapped   *atomic.Int64
	exposed   *atomic.Int64
}

func (d breakingDB) rewrite(sql string) string {
	if d.functions && (strings.Contains(sql, "fencekit_guard_try(") || strings.Contains(sql, "fencekit_guard_admit(")) {
		d.swapped.Add(1)
	}
	for _, b := range d.breaks {
		if strings.Contains(sql, b.old) {
			sql = strings.ReplaceAll(sql, b.old, b.new)
			d.swapped.Add(1)
		}
	}
	return sql
}

func (d breakingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.Pool.Exec(ctx, d.rewrite(sql), args...)
}

func (d breakingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.Pool.Query(ctx, d.rewrite(sql), args...)
}

func (d breakingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.Pool.QueryRow(ctx, d.rewrite(sql), args...)
}

func (d breakingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if (d.unlocked || d.snapshot) && beginsGuarded(b) {
		return d.beginBroken(ctx, b)
	}
	for _, q := range b.QueuedQueries {
		q.SQL = d.rewrite(q.SQL)
	}
	return d.Pool.SendBatch(ctx, b)
}

func (d breakingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return breakingTx{Tx: tx, db: d}, nil
}

func (d breakingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.Pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return breakingTx{Tx: tx, db: d}, nil
}

type breakingTx struct {
	pgx.Tx
	db breakingDB
}

func (t breakingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, t.db.rewrite(sql), args...)
}

func (t breakingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, t.db.rewrite(sql), args...)
}

func (t breakingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.db.unlocked && strings.HasPrefix(sql, pgGuardPrefix) && len(args) == 3 {
		t.db.swapped.Add(1)
		return unlockedGuard(ctx, t.Tx, args[0].(string), args[1].(int64), args[2].(string), t.db.exposed)
	}
	if t.db.snapshot && strings.HasPrefix(sql, pgGuardPrefix) && len(args) == 3 {
		t.db.swapped.Add(1)
		return snapshotGuard(ctx, t.Tx, args[0].(string), args[1].(int64), args[2].(string), t.db.exposed)
	}
	return t.Tx.QueryRow(ctx, t.db.rewrite(sql), args...)
}

func (t breakingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		q.SQL = t.db.rewrite(q.SQL)
	}
	return t.Tx.SendBatch(ctx, b)
}

// pgAdmitPrefix is the raising guard statement (pgcore.GuardAdmitSQL),
// which InTx and Once send in one batch after BEGIN.
const pgAdmitPrefix = pgcore.GuardAdmitSQL

// beginsGuarded reports whether b is InTx's opening batch: BEGIN, then the
// raising guard.
func beginsGuarded(b *pgx.Batch) bool {
	q := b.QueuedQueries
	return len(q) == 2 && strings.HasPrefix(strings.ToLower(q[0].SQL), "begin") &&
		strings.HasPrefix(q[1].SQL, pgAdmitPrefix) && len(q[1].Arguments) == 3
}

// beginBroken runs InTx's opening batch b (see beginsGuarded) as a
// transaction of breakingTx, whose guard statement is the broken one
// (unlockedGuard or snapshotGuard), and answers as the batch does: a stale
// fence fails the guard with SQLSTATE FK001 and its mark in DETAIL.
func (d breakingDB) beginBroken(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := d.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: b.QueuedQueries[0].SQL})
	if err != nil {
		return &brokenBatch{errs: []error{err}}
	}
	bt := breakingTx{Tx: tx, db: d}
	args := b.QueuedQueries[1].Arguments
	var admitted bool
	gerr := bt.QueryRow(ctx, pgGuardPrefix, args...).Scan(&admitted)
	if errors.Is(gerr, pgx.ErrNoRows) {
		var mt int64
		var mh string
		gerr = tx.QueryRow(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1`, args[0]).Scan(&mt, &mh)
		if gerr == nil {
			detail, _ := json.Marshal(map[string]any{"token": mt, "holder": mh})
			gerr = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "FK001", Message: "stale fence", Detail: string(detail)}
		}
	}
	return &brokenBatch{tx: bt, errs: []error{nil, gerr}}
}

// brokenBatch is the pgx.BatchResults of beginBroken: errs are the results
// of the batch's statements, in order.
type brokenBatch struct {
	tx   pgx.Tx
	errs []error
	next int
}

func (b *brokenBatch) Exec() (pgconn.CommandTag, error) {
	if b.next >= len(b.errs) {
		return pgconn.CommandTag{}, errors.New("history: no more results in the batch")
	}
	b.next++
	return pgconn.CommandTag{}, b.errs[b.next-1]
}

func (b *brokenBatch) Query() (pgx.Rows, error) {
	return nil, errors.New("history: brokenBatch answers Exec only")
}

func (b *brokenBatch) QueryRow() pgx.Row {
	return errRow{errors.New("history: brokenBatch answers Exec only")}
}

func (b *brokenBatch) Close() error {
	for _, err := range b.errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *brokenBatch) Tx() pgx.Tx { return b.tx }

// pgGuardPrefix is the guard statement of storage/postgres's Guard and of
// its InTx on a transaction (pgcore.GuardSQL).
const pgGuardPrefix = pgcore.GuardSQL

// unlockedGuard is the broken guard of the row-lock control: it reads the
// mark without locking it, decides by the fence rule in the client, and
// then writes the mark unconditionally. Another holder can be admitted
// between the read and the write, which then lowers the mark. It answers
// as the guard's upsert does: a row (true) when admitted, no row when
// stale. It counts in exposed the marks it overwrote that were newer than
// its fence (read for counting only, with a locking read before the write:
// a read in the write's own RETURNING saw the mark as of the statement's
// start, and counted almost none).
func unlockedGuard(ctx context.Context, tx pgx.Tx, res string, tok int64, holder string, exposed *atomic.Int64) pgx.Row {
	var mt *int64
	var mh *string
	err := tx.QueryRow(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1`, res).Scan(&mt, &mh)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return errRow{err}
	}
	if mt != nil && !(tok > *mt || (tok == *mt && holder == *mh)) {
		return errRow{pgx.ErrNoRows}
	}
	// A client pays a round trip between its read and its write, and may
	// be slow to send the write: up to 20 ms here.
	time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
	// The test looks (locking, as the write would) to count a write that
	// goes wrong; the write does not use it.
	mt, mh = nil, nil
	err = tx.QueryRow(ctx, `SELECT token, holder FROM fencekit_guard WHERE resource = $1 FOR UPDATE`, res).Scan(&mt, &mh)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return errRow{err}
	}
	if mt != nil && (*mt > tok || (*mt == tok && *mh != holder)) {
		exposed.Add(1)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fencekit_guard AS g (resource, token, holder) VALUES ($1, $2, $3)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder`, res, tok, holder); err != nil {
		return errRow{err}
	}
	return errRow{nil}
}

// errRow is a pgx.Row that scans true, or returns its error.
type errRow struct{ err error }

func (r errRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	if len(dest) == 1 {
		if b, ok := dest[0].(*bool); ok {
			*b = true
		}
	}
	return nil
}

// breakAdmitFunction replaces the guard functions of migration 00005
// (fencekit_guard_admit, the batch's, and fencekit_guard_try, the
// transactions'), in the test's own schema (the connection's search_path),
// by the migration's functions with breaks applied: the guards then admit
// by the broken rule. It fails t if a break is not found in each function.
func breakAdmitFunction(t testing.TB, admin *pgxpool.Pool, breaks []sqlBreak) {
	t.Helper()
	for _, fn := range brokenGuardFunctions(t, breaks) {
		if _, err := admin.Exec(context.Background(), fn); err != nil {
			t.Fatalf("broken variant: %v", err)
		}
	}
}

// brokenGuardFunctions returns migration 00005's functions with breaks
// applied, each a statement that replaces one.
func brokenGuardFunctions(t testing.TB, breaks []sqlBreak) []string {
	t.Helper()
	src, err := os.ReadFile("../../../migrations/00005_fencekit_guard_admit_writes_on_change.sql")
	if err != nil {
		t.Fatalf("broken variant: %v", err)
	}
	up, _, _ := strings.Cut(string(src), "-- +goose Down")
	var fns []string
	for _, name := range []string{"fencekit_guard_admit", "fencekit_guard_try"} {
		begin := strings.Index(up, "CREATE OR REPLACE FUNCTION "+name+"(")
		end := strings.Index(up[max(begin, 0):], "$$;")
		if begin < 0 || end < 0 {
			t.Fatalf("broken variant: %s not found in its migration: update the control", name)
		}
		fn := up[begin : begin+end+3]
		for _, b := range breaks {
			if !strings.Contains(fn, b.old) {
				t.Fatalf("broken variant: %q not found in %s: update the control", b.old, name)
			}
			fn = strings.ReplaceAll(fn, b.old, b.new)
		}
		fns = append(fns, fn)
	}
	return fns
}

// onceAfter is the broken Once of its control: it runs the work in one
// guarded transaction and records its completion afterwards, in another. A
// second call that comes before the record, or after a lost reply of the
// first, runs the work again. It counts in exposed the runs whose record
// was found taken after the work had committed.
func onceAfter(ctx context.Context, db postgres.Beginner, f fence.Fence, key string, fn postgres.TxFunc, exposed *atomic.Int64) (bool, error) {
	var done bool
	err := postgres.InTx(ctx, db, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT true FROM fencekit_once WHERE key = $1`, key).Scan(&done)
		if errors.Is(err, pgx.ErrNoRows) {
			done = false
			return fn(ctx, tx)
		}
		return err
	})
	if err != nil || done {
		return false, err
	}
	var claimed bool
	err = postgres.InTx(ctx, db, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO fencekit_once (key, resource, token, holder) VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO NOTHING RETURNING true`, key, f.Resource, int64(f.Token), f.Holder).Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			exposed.Add(1)
			return nil
		}
		return err
	})
	return claimed, err
}

// brokenRan logs how many statements a SQL-changing variant sent broken,
// and fails t when guarded calls were answered (guarded) but none of their
// statements was changed: the guards then send other statements than the
// variant changes, and it must be updated.
func brokenRan(t testing.TB, swapped, guarded int64) {
	t.Helper()
	t.Logf("the broken variant changed %d statements; %d guarded calls were answered", swapped, guarded)
	if swapped == 0 && guarded >= 5 {
		t.Fatal("the broken variant's statements never ran: the guards send other statements, update the control")
	}
}
