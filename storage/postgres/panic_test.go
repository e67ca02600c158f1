package postgres_test

import (
	"context"
	"database/sql/driver"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// panicValue is what the callbacks below panic with; the library must let
// this very value continue.
type panicValue struct{ where string }

// leakSetup is setup for tests that provoke leaks: the pool's connections
// carry an application_name of the test's own, and when the test ends, any
// backend of it still connected is terminated and the pool is closed only if
// every connection came back. A leak then fails the test instead of hanging
// its cleanup on the leaked connection's locks.
func leakSetup(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := "fkleak_" + fence.NewHolder()[:12]
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, testenv.PostgresBaseURL(t)); err == nil {
			_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
			_ = conn.Close(ctx)
		}
		if pool.Stat().AcquiredConns() == 0 {
			pool.Close()
		}
	})
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	mustExec(t, ctx, pool, `CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL, writer bigint NOT NULL DEFAULT 0)`)
	mustExec(t, ctx, pool, `INSERT INTO counter (id, n) VALUES (1, 0)`)
	return ctx, pool
}

// recovered runs fn and returns what it panicked with.
func recovered(fn func()) (v any) {
	defer func() { v = recover() }()
	fn()
	return nil
}

func wantPanic(t *testing.T, got any, want panicValue) {
	t.Helper()
	if got != want {
		t.Fatalf("recovered %#v, want the callback's own panic value %#v", got, want)
	}
}

// wantAllReturned polls until every pool connection is back, failing t after
// a deadline.
func wantAllReturned(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d pool connections still checked out after the panic", pool.Stat().AcquiredConns())
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not a wait for the condition itself
	}
}

// wantNextHolderAdmitted runs a newer holder's InTx on resource from another
// goroutine, bounded by a deadline: a deadline-exceeded means the guard row is
// still locked by the transaction the panic left behind.
func wantNextHolderAdmitted(t *testing.T, ctx context.Context, pool *pgxpool.Pool, f fence.Fence) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE counter SET writer = $1 WHERE id = 1`, int64(f.Token))
			return err
		})
	}()
	if err := <-done; err != nil {
		t.Fatalf("next holder %v after the panic: %v (the guard row is still locked)", f, err)
	}
}

func TestInTxPanicRollsBackAndReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"InTx"}
	got := recovered(func() {
		_ = postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("counter", 1, "a"), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE counter SET n = 99 WHERE id = 1`); err != nil {
				return err
			}
			panic(want)
		})
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	wantNextHolderAdmitted(t, ctx, pool, fenceOf("counter", 2, "b"))
	if n, writer := counter(t, ctx, pool); n != 0 || writer != 2 {
		t.Fatalf("n = %d, writer = %d; want the panicking write rolled back (0) and the next holder's write (2)", n, writer)
	}
	if got := mark(t, ctx, pool, "counter"); got != fenceOf("counter", 2, "b") {
		t.Fatalf("mark = %v, want the next holder's", got)
	}
}

// A callback that panics while its rows are still open leaves the connection
// busy; it must be given back (closed) all the same.
func TestInTxPanicWithOpenRowsReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"InTx rows"}
	got := recovered(func() {
		_ = postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("counter", 1, "a"), func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 1000) AS g`)
			if err != nil {
				return err
			}
			rows.Next()
			panic(want)
		})
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	wantNextHolderAdmitted(t, ctx, pool, fenceOf("counter", 2, "b"))
}

func TestInTxSavepointPanicRollsBackSavepoint(t *testing.T) {
	ctx, pool := leakSetup(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	want := panicValue{"InTx savepoint"}
	got := recovered(func() {
		_ = postgres.InTx(ctx, tx, pgx.TxOptions{}, fenceOf("counter", 1, "a"), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE counter SET n = 99 WHERE id = 1`); err != nil {
				return err
			}
			panic(want)
		})
	})
	wantPanic(t, got, want)
	// The outer transaction goes on without the savepoint's work.
	var n int64
	if err := tx.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
		t.Fatalf("outer transaction after the panic: %v", err)
	}
	if n != 0 {
		t.Fatalf("n = %d inside the outer transaction, want the savepoint rolled back", n)
	}
	if m := mark(t, ctx, tx, "counter"); m.Token != 0 {
		t.Fatalf("mark = %v inside the outer transaction, want the savepoint's guard rolled back", m)
	}
}

func TestQueryPanicReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"Query"}
	read := postgres.Statement{SQL: `SELECT g FROM generate_series(1, 1000) AS g`}
	got := recovered(func() {
		_ = postgres.Query(ctx, pool, fenceOf("counter", 1, "a"), read, func(rows pgx.Rows) error {
			rows.Next()
			panic(want)
		})
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	wantNextHolderAdmitted(t, ctx, pool, fenceOf("counter", 2, "b"))
}

// panicValuer panics when pgx asks it for its value while encoding a
// statement's arguments: user code that runs inside the driver.
type panicValuer struct{ want panicValue }

func (p panicValuer) Value() (driver.Value, error) { panic(p.want) }

func TestExecArgumentPanicReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"Exec argument"}
	got := recovered(func() {
		_, _ = postgres.Exec(ctx, pool, fenceOf("counter", 1, "a"),
			postgres.Statement{SQL: `UPDATE counter SET n = $1 WHERE id = 1`, Args: []any{panicValuer{want}}})
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	wantNextHolderAdmitted(t, ctx, pool, fenceOf("counter", 2, "b"))
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, want the panicking batch not applied", n)
	}
}

func TestQueryArgumentPanicReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"Query argument"}
	read := postgres.Statement{SQL: `SELECT n FROM counter WHERE id = $1`, Args: []any{panicValuer{want}}}
	got := recovered(func() {
		_ = postgres.Query(ctx, pool, fenceOf("counter", 1, "a"), read, func(pgx.Rows) error { return nil })
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	wantNextHolderAdmitted(t, ctx, pool, fenceOf("counter", 2, "b"))
}

func TestTableArgumentPanicReturnsConnection(t *testing.T) {
	ctx, pool := leakSetup(t)
	mustExec(t, ctx, pool, `CREATE TABLE acct (id text PRIMARY KEY, balance bigint, fence_token bigint, fence_holder text, version bigint NOT NULL DEFAULT 1)`)
	mustExec(t, ctx, pool, `INSERT INTO acct (id) VALUES ('k')`)
	tbl := postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id"}
	f := fenceOf("acct", 1, "a")
	calls := map[string]func(v panicValuer){
		"Update value": func(v panicValuer) { _ = tbl.Update(ctx, pool, f, "k", postgres.Set("balance", v)) },
		"Update key":   func(v panicValuer) { _ = tbl.Update(ctx, pool, f, v, postgres.Set("balance", 1)) },
		"Upsert value": func(v panicValuer) { _ = tbl.Upsert(ctx, pool, f, "k", postgres.Set("balance", v)) },
		"UpdateVersion value": func(v panicValuer) {
			_, _ = tbl.UpdateVersion(ctx, pool, "k", 1, postgres.Set("balance", v))
		},
		"UpdateVersion key": func(v panicValuer) { _, _ = tbl.UpdateVersion(ctx, pool, v, 1) },
	}
	for name, call := range calls {
		want := panicValue{name}
		wantPanic(t, recovered(func() { call(panicValuer{want}) }), want)
		wantAllReturned(t, pool)
	}
	var bal *int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM acct WHERE id = 'k'`).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	if bal != nil {
		t.Fatalf("balance = %d, want no write from a panicking call", *bal)
	}
}

func TestRetryLetsPanicContinue(t *testing.T) {
	want := panicValue{"Retry"}
	calls := 0
	got := recovered(func() {
		_ = postgres.Retry(context.Background(), 3, func(context.Context) error {
			calls++
			panic(want)
		})
	})
	wantPanic(t, got, want)
	if calls != 1 {
		t.Fatalf("fn called %d times, want a panic not to be retried", calls)
	}
}
