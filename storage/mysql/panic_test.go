package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencekit/fencekit/storage/mysql"
)

// TestInTxPanicRollsBackAndRepanics panics in fn after a write: the panic
// reaches the caller with its own value, the write and the guard are rolled
// back, the connection is back in the pool, and the next holder is not kept
// waiting on the guard row.
func TestInTxPanicRollsBackAndRepanics(t *testing.T) {
	ctx, db := setup(t)
	type boom struct{ n int }
	func() {
		defer func() {
			if r := recover(); r != (boom{7}) {
				t.Fatalf("recovered %v, want the panic's own value", r)
			}
		}()
		_ = mysql.InTx(ctx, db, nil, fenceOf("r", 1, "h1"), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = 99 WHERE id = 1`); err != nil {
				return err
			}
			panic(boom{7})
		})
		t.Fatal("InTx returned instead of panicking")
	}()
	if n, _ := counter(t, ctx, db); n != 0 {
		t.Fatalf("counter = %d after a panic, want 0", n)
	}
	if got := mark(t, ctx, db, "r"); got.Token != 0 {
		t.Fatalf("mark = %v after a panic, want none", got)
	}
	if inUse := db.Stats().InUse; inUse != 0 {
		t.Fatalf("%d connections in use after a panic, want 0", inUse)
	}
	// A next holder gets the guard row at once, not after the lock wait
	// timeout.
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raise(t, quick, db, fenceOf("r", 2, "h2"))
}

// TestRetryPanicContinues shows that Retry neither retries nor swallows a
// panic.
func TestRetryPanicContinues(t *testing.T) {
	calls := 0
	defer func() {
		if r := recover(); r != "stop" || calls != 1 {
			t.Fatalf("recovered %v after %d calls, want the panic after 1", r, calls)
		}
	}()
	_ = mysql.Retry(context.Background(), 3, func(context.Context) error {
		calls++
		panic("stop")
	})
}
