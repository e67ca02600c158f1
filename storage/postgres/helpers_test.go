package postgres_test

import (
	"context"
	"errors"
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

// setup returns a pool on a schema of the test's own, migrated, with a
// counter table: counter(id int primary key, n bigint, writer bigint).
func setup(t testing.TB) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	pool := testenv.Postgres(t)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	mustExec(t, ctx, pool, `CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL, writer bigint NOT NULL DEFAULT 0)`)
	mustExec(t, ctx, pool, `INSERT INTO counter (id, n) VALUES (1, 0)`)
	return ctx, pool
}

func mustExec(t testing.TB, ctx context.Context, db postgres.Querier, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func counter(t testing.TB, ctx context.Context, db postgres.Querier) (n, writer int64) {
	t.Helper()
	if err := db.QueryRow(ctx, `SELECT n, writer FROM counter WHERE id = 1`).Scan(&n, &writer); err != nil {
		t.Fatal(err)
	}
	return n, writer
}

func mark(t testing.TB, ctx context.Context, db postgres.Querier, resource string) fence.Fence {
	t.Helper()
	m, err := postgres.HighWater(ctx, db, resource)
	if err != nil {
		t.Fatalf("HighWater(%q): %v", resource, err)
	}
	return m
}

// raise sets the mark of f.Resource to f through a committed guard.
func raise(t testing.TB, ctx context.Context, db postgres.Beginner, f fence.Fence) {
	t.Helper()
	err := postgres.InTx(ctx, db, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil })
	if err != nil {
		t.Fatalf("raise %v: %v", f, err)
	}
}

func wantStale(t testing.TB, err error, hwm fence.Fence) {
	t.Helper()
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("err = %v, want ErrStale", err)
	}
	got, ok := fence.LostTo(err)
	if !ok || got != hwm {
		t.Fatalf("HighWater(err) = %v, %v; want %v", got, ok, hwm)
	}
}

// waitBlocked polls until the backend pid waits on a lock, failing t after a
// deadline.
func waitBlocked(t testing.TB, ctx context.Context, db postgres.Querier, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&waiting)
		if err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited on a lock", pid)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not a wait for the condition itself
	}
}

// acquire takes a dedicated connection from the pool for the test.
func acquire(t testing.TB, ctx context.Context, pool *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Release)
	return c
}

func fenceOf(resource string, token int64, holder string) fence.Fence {
	return fence.Fence{Resource: resource, Token: fence.Token(token), Holder: holder}
}
