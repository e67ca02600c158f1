// Package pgsqlsuite is the test suite that storage/pgsql must pass through
// every database/sql driver it supports. storage/pgsql's own tests run it
// through pgx's stdlib (with its statement cache, and with the simple
// protocol a transaction-mode pooler needs); the integration module runs it
// through lib/pq, which fencekit's own module does not require.
package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// Driver is one way of reaching PostgreSQL through database/sql.
type Driver struct {
	// Name names the driver in test names and logs.
	Name string
	// Open opens a database on u, a postgres:// URL whose search_path
	// parameter names the test's own schema.
	Open func(u string) (*sql.DB, error)
	// Reprepare is the round trips the driver spends, on the call after a
	// statement failed, preparing that statement again: pgx's statement
	// cache drops a statement after any error, then deallocates and
	// prepares it (2); drivers that prepare nothing spend none.
	Reprepare int64
}

// Run runs every test of the suite through d.
func Run(t *testing.T, d Driver) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, d) })
	}
}

// RunOnly runs the named tests of the suite through d.
func RunOnly(t *testing.T, d Driver, names ...string) {
	for _, tc := range tests {
		for _, name := range names {
			if tc.name == name {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, d) })
			}
		}
	}
}

type test struct {
	name string
	fn   func(t *testing.T, d Driver)
}

var tests []test

// register adds tests to the suite; each file registers its own.
func register(ts ...test) { tests = append(tests, ts...) }

// env is one test's database: a schema of its own, migrated, with a
// counter table counter(id int primary key, n bigint).
type env struct {
	t   *testing.T
	ctx context.Context
	url string
	db  *sql.DB
	d   Driver
}

func setup(t *testing.T, d Driver) *env {
	t.Helper()
	e := bare(t, d)
	if err := migrations.Up(e.ctx, e.db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	e.exec(`CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL)`)
	e.exec(`INSERT INTO counter (id, n) VALUES (1, 0)`)
	return e
}

// bare is setup without migrations or tables.
func bare(t *testing.T, d Driver) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	u := testenv.PostgresURL(t)
	return &env{t: t, ctx: ctx, url: u, db: open(t, d, u), d: d}
}

func open(t *testing.T, d Driver, u string) *sql.DB {
	t.Helper()
	db, err := d.Open(u)
	if err != nil {
		t.Fatalf("open %s: %v", d.Name, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// via returns the test's URL with its host replaced by addr (a fault
// proxy's).
func (e *env) via(addr string) string {
	u, err := url.Parse(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

func (e *env) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx, q, args...); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
}

func (e *env) counter() int64 {
	e.t.Helper()
	var n int64
	if err := e.db.QueryRowContext(e.ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) mark(resource string) fence.Fence {
	e.t.Helper()
	m, err := pgsql.HighWater(e.ctx, e.db, resource)
	if err != nil {
		e.t.Fatalf("HighWater(%q): %v", resource, err)
	}
	return m
}

// raise commits f's guard.
func (e *env) raise(f fence.Fence) {
	e.t.Helper()
	if err := pgsql.InTx(e.ctx, e.db, nil, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
		e.t.Fatalf("raise %v: %v", f, err)
	}
}

func (e *env) begin(level sql.IsolationLevel) *sql.Tx {
	e.t.Helper()
	tx, err := e.db.BeginTx(e.ctx, &sql.TxOptions{Isolation: level})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// increment is fn for InTx: read the counter, write it plus one.
func increment(ctx context.Context, tx *sql.Tx) error {
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE counter SET n = $1 WHERE id = 1`, n+1)
	return err
}

// pid returns the backend pid of tx's connection.
func pid(t *testing.T, ctx context.Context, tx *sql.Tx) int64 {
	t.Helper()
	var p int64
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitBlocked polls until backend p waits for a lock.
func (e *env) waitBlocked(p int64) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting bool
		err := e.db.QueryRowContext(e.ctx, `SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, p).Scan(&waiting)
		if err != nil {
			e.t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("backend %d never waited for a lock", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCounter polls until the counter reads n.
func (e *env) waitCounter(n int64) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if got := e.counter(); got == n {
			return
		} else if time.Now().After(deadline) {
			e.t.Fatalf("counter = %d, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fenceOf(resource string, token int64, holder string) fence.Fence {
	return fence.Fence{Resource: resource, Token: fence.Token(token), Holder: holder}
}

// wantStale fails t unless err is a stale refusal that lost to hwm.
func wantStale(t *testing.T, err error, hwm fence.Fence) {
	t.Helper()
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) {
		t.Fatalf("err = %v, want a stale refusal", err)
	}
	if se.HighWater.Token != hwm.Token || se.HighWater.Holder != hwm.Holder {
		t.Fatalf("stale error carries mark %v, want %v", se.HighWater, hwm)
	}
}
