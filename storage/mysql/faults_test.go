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
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestDeadlockIsRetryable makes two transactions guard two resources in
// opposite orders: the server picks one as the deadlock victim (error 1213),
// which must match ErrRetryable and the driver's error.
func TestDeadlockIsRetryable(t *testing.T) {
	ctx, db := setup(t)
	tx1, _ := begin(t, ctx, db, sql.LevelRepeatableRead)
	tx2, id2 := begin(t, ctx, db, sql.LevelRepeatableRead)
	if err := mysql.Guard(ctx, tx1, fenceOf("a", 1, "h1")); err != nil {
		t.Fatal(err)
	}
	if err := mysql.Guard(ctx, tx2, fenceOf("b", 1, "h2")); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- mysql.Guard(ctx, tx2, fenceOf("a", 2, "h2")) }()
	waitBlocked(t, ctx, db, id2)
	errs <- mysql.Guard(ctx, tx1, fenceOf("b", 2, "h1"))
	var victims int
	for range 2 {
		err := <-errs
		if err == nil {
			continue
		}
		var myErr *drv.MySQLError
		if !errors.Is(err, mysql.ErrRetryable) || !errors.As(err, &myErr) || myErr.Number != 1213 {
			t.Fatalf("err = %v, want ErrRetryable wrapping error 1213", err)
		}
		victims++
	}
	if victims != 1 {
		t.Fatalf("%d deadlock victims, want 1", victims)
	}
}

// TestLockWaitTimeoutIsRetryable holds a guard row while InTx, on a
// connection with a one-second lock wait timeout, tries the same resource.
func TestLockWaitTimeoutIsRetryable(t *testing.T) {
	cfg := testenv.MySQLConfig(t)
	ctx, db := setupWith(t, cfg)
	holder, _ := begin(t, ctx, db, sql.LevelRepeatableRead)
	if err := mysql.Guard(ctx, holder, fenceOf("r", 1, "h1")); err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	impatient := testenv.OpenMySQL(t, cfg)
	ran := false
	err := mysql.InTx(ctx, impatient, nil, fenceOf("r", 2, "h2"), func(context.Context, *sql.Tx) error {
		ran = true
		return nil
	})
	var myErr *drv.MySQLError
	if !errors.Is(err, mysql.ErrRetryable) || !errors.As(err, &myErr) || myErr.Number != 1205 {
		t.Fatalf("InTx = %v, want ErrRetryable wrapping error 1205", err)
	}
	if ran {
		t.Fatal("fn ran although the guard failed")
	}
	// Once the holder is gone, Retry gets through.
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	err = mysql.Retry(ctx, 0, func(ctx context.Context) error {
		return mysql.InTx(ctx, impatient, nil, fenceOf("r", 2, "h2"), func(context.Context, *sql.Tx) error { return nil })
	})
	if err != nil {
		t.Fatalf("Retry after the holder left: %v", err)
	}
}

// proxied returns a database reached through a fault proxy, and one reached
// directly, both on the test's migrated database.
func proxied(t *testing.T) (context.Context, *sql.DB, *sql.DB, *testenv.Proxy) {
	t.Helper()
	cfg := testenv.MySQLConfig(t)
	ctx, direct := setupWith(t, cfg)
	p := testenv.StartProxy(t, cfg.Addr)
	pcfg := cfg.Clone()
	pcfg.Addr = p.Addr()
	db := testenv.OpenMySQL(t, pcfg)
	db.SetMaxIdleConns(0) // a broken connection must not be handed out again
	return ctx, db, direct, p
}

// waitCounter polls until the counter reads n, failing t after a deadline.
func waitCounter(t *testing.T, ctx context.Context, db *sql.DB, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ := counter(t, ctx, db)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter = %d, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCommitInFlightWhenContextEnds blocks the network once fn's write is
// acknowledged, so the COMMIT is sent but unanswered when InTx's context
// ends. The outcome is unknown, and InTx must say so rather than report a
// rollback: once the network heals, the COMMIT does land.
func TestCommitInFlightWhenContextEnds(t *testing.T) {
	ctx, db, direct, p := proxied(t)
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := mysql.InTx(callCtx, db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		p.Block()
		return nil
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("InTx = %v, want ErrOutcomeUnknown caused by the deadline", err)
	}
	if n, _ := counter(t, ctx, direct); n != 0 {
		t.Fatalf("counter = %d while the COMMIT is held, want 0", n)
	}
	p.Unblock()
	waitCounter(t, ctx, direct, 1)
}

// TestCommitReplyLost drops the server's answer to COMMIT and cuts the
// connection: the write is applied, and InTx returns ErrOutcomeUnknown.
func TestCommitReplyLost(t *testing.T) {
	ctx, db, direct, p := proxied(t)
	err := mysql.InTx(ctx, db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		p.LoseNextReply(nil)
		return nil
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("InTx = %v, want ErrOutcomeUnknown", err)
	}
	waitCounter(t, ctx, direct, 1)
}

// TestContextEndsBeforeCommit cancels the context inside fn: the COMMIT is
// never sent, the transaction is rolled back, and the error says so (the
// context's error, not an unknown outcome).
func TestContextEndsBeforeCommit(t *testing.T) {
	ctx, db := setup(t)
	callCtx, cancel := context.WithCancel(ctx)
	err := mysql.InTx(callCtx, db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("InTx = %v, want context.Canceled and a known outcome", err)
	}
	if n, _ := counter(t, ctx, db); n != 0 {
		t.Fatalf("counter = %d, want 0: the transaction must be rolled back", n)
	}
	if got := mark(t, ctx, db, "r"); got.Token != 0 {
		t.Fatalf("mark = %v, want none: the guard must be rolled back too", got)
	}
}

// TestRetryStopsAtUnknownOutcome: a write that may have landed is never
// retried blindly, nor is a stale fence; deadlocks are.
func TestRetryStopsAtUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		err   error
		calls int
	}{
		"unknown outcome": {&fence.OutcomeUnknownError{Op: "commit", Err: context.DeadlineExceeded}, 1},
		"stale":           {&fence.StaleError{}, 1},
		"retryable":       {&mysql.RetryableError{Err: &drv.MySQLError{Number: 1213}}, 3},
	} {
		calls := 0
		err := mysql.Retry(ctx, 3, func(context.Context) error { calls++; return tc.err })
		if calls != tc.calls || !errors.Is(err, tc.err) {
			t.Errorf("%s: %d calls, err %v; want %d calls and the error", name, calls, err, tc.calls)
		}
	}
}
