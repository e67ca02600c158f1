package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	drv "github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// setup returns a *sql.DB on a database of the test's own, migrated, with a
// counter table: counter(id INT PRIMARY KEY, n BIGINT, writer BIGINT).
func setup(t testing.TB) (context.Context, *sql.DB) {
	t.Helper()
	cfg := testenv.MySQLConfig(t)
	return setupWith(t, cfg)
}

// setupWith is setup on a configuration the test adjusted.
func setupWith(t testing.TB, cfg *drv.Config) (context.Context, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	db := testenv.OpenMySQL(t, cfg)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	mustExec(t, ctx, db, `CREATE TABLE counter (id INT PRIMARY KEY, n BIGINT NOT NULL, writer BIGINT NOT NULL DEFAULT 0)`)
	mustExec(t, ctx, db, `INSERT INTO counter (id, n) VALUES (1, 0)`)
	return ctx, db
}

func mustExec(t testing.TB, ctx context.Context, db mysql.Querier, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func counter(t testing.TB, ctx context.Context, db mysql.Querier) (n, writer int64) {
	t.Helper()
	if err := db.QueryRowContext(ctx, `SELECT n, writer FROM counter WHERE id = 1`).Scan(&n, &writer); err != nil {
		t.Fatal(err)
	}
	return n, writer
}

func mark(t testing.TB, ctx context.Context, db mysql.Querier, resource string) fence.Fence {
	t.Helper()
	m, err := mysql.HighWater(ctx, db, resource)
	if err != nil {
		t.Fatalf("HighWater(%q): %v", resource, err)
	}
	return m
}

// raise sets the mark of f.Resource to f through a committed guard.
func raise(t testing.TB, ctx context.Context, db *sql.DB, f fence.Fence) {
	t.Helper()
	if err := mysql.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
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

// begin starts a transaction at level on a connection of its own and
// returns it with the server's id for that connection.
func begin(t testing.TB, ctx context.Context, db *sql.DB, level sql.IsolationLevel) (*sql.Tx, int64) {
	t.Helper()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var id int64
	if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return tx, id
}

// waitBlocked polls until the server connection id waits on a row lock,
// failing t after a deadline.
func waitBlocked(t testing.TB, ctx context.Context, db mysql.Querier, id int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX
WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`, id).Scan(&n)
		if err != nil {
			t.Fatalf("INNODB_TRX: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection %d never waited on a lock", id)
		}
		// InnoDB refreshes what INNODB_TRX shows only when nobody read it
		// for 100 ms: polling faster would see the same snapshot forever.
		time.Sleep(150 * time.Millisecond)
	}
}

func fenceOf(resource string, token int64, holder string) fence.Fence {
	return fence.Fence{Resource: resource, Token: fence.Token(token), Holder: holder}
}
