package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

func TestGuardAdmission(t *testing.T) {
	hwm := fenceOf("r", 5, "a")
	tests := []struct {
		name    string
		f       fence.Fence
		admit   bool
		newMark fence.Fence
	}{
		{"lower token is stale", fenceOf("r", 4, "a"), false, hwm},
		{"equal token same holder is admitted", fenceOf("r", 5, "a"), true, hwm},
		{"equal token other holder is stale", fenceOf("r", 5, "b"), false, hwm},
		{"higher token is admitted and raises the mark", fenceOf("r", 6, "b"), true, fenceOf("r", 6, "b")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, pool := setup(t)
			raise(t, ctx, pool, hwm)

			// Guard directly in a transaction that also writes data.
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			mustExec(t, ctx, tx, `UPDATE counter SET n = 42 WHERE id = 1`)
			err = postgres.Guard(ctx, tx, tt.f)
			if tt.admit {
				if err != nil {
					t.Fatalf("Guard(%v) = %v, want admitted", tt.f, err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if n, _ := counter(t, ctx, pool); n != 42 {
					t.Fatalf("n = %d after admitted write, want 42", n)
				}
			} else {
				wantStale(t, err, hwm)
				var se *fence.StaleError
				if !errors.As(err, &se) || se.Fence != tt.f {
					t.Fatalf("StaleError.Fence = %+v, want %v", se, tt.f)
				}
				// The stale guard still locks the row; release it.
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				// Through the helper, a stale guard keeps fn's writes out.
				ran := false
				err = postgres.InTx(ctx, pool, pgx.TxOptions{}, tt.f, func(ctx context.Context, tx pgx.Tx) error {
					ran = true
					_, err := tx.Exec(ctx, `UPDATE counter SET n = 99 WHERE id = 1`)
					return err
				})
				wantStale(t, err, hwm)
				if ran {
					t.Fatal("InTx ran fn for a stale fence")
				}
				if n, _ := counter(t, ctx, pool); n != 0 {
					t.Fatalf("n = %d after stale guard, want 0 (nothing committed)", n)
				}
			}
			if got := mark(t, ctx, pool, "r"); got != tt.newMark {
				t.Fatalf("mark = %v, want %v", got, tt.newMark)
			}
		})
	}
}

func TestGuardFirstGrantAndHighWater(t *testing.T) {
	ctx, pool := setup(t)
	if got := mark(t, ctx, pool, "never"); got != (fence.Fence{Resource: "never"}) {
		t.Fatalf("HighWater of unguarded resource = %v, want zero token", got)
	}
	f := fenceOf("first", 1, "h")
	raise(t, ctx, pool, f)
	if got := mark(t, ctx, pool, "first"); got != f {
		t.Fatalf("mark = %v, want %v", got, f)
	}
}

// A stale guard that had to wait for the winner's row lock must report the
// winner's mark, not the mark that was committed when it started: the upsert
// re-reads the row it waited for, and the follow-up read happens under the
// row lock the upsert left.
func TestGuardWaitsForWinnerAndReportsItsMark(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			ctx, pool := setup(t)
			raise(t, ctx, pool, fenceOf("r", 2, "old"))

			winner := fenceOf("r", 5, "winner")
			loser := fenceOf("r", 4, "loser") // newer than the committed mark 2
			cw := acquire(t, ctx, pool)
			txW, err := cw.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer txW.Rollback(ctx)
			if err := postgres.Guard(ctx, txW, winner); err != nil {
				t.Fatal(err)
			}

			cl := acquire(t, ctx, pool)
			txL, err := cl.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer txL.Rollback(ctx)
			// Take the loser's snapshot now, before the winner commits.
			mustExec(t, ctx, txL, `SELECT 1 FROM counter`)
			done := make(chan error, 1)
			go func() { done <- postgres.Guard(ctx, txL, loser) }()
			waitBlocked(t, ctx, pool, cl.Conn().PgConn().PID())
			if err := txW.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			err = <-done
			if iso == pgx.ReadCommitted {
				wantStale(t, err, winner)
			} else {
				if !errors.Is(err, postgres.ErrRetryable) {
					t.Fatalf("Guard at %s after a concurrent raise = %v, want ErrRetryable", iso, err)
				}
				_ = txL.Rollback(ctx)
				// A fresh attempt sees the winner and is stale.
				err = postgres.InTx(ctx, pool, pgx.TxOptions{IsoLevel: iso}, loser, func(context.Context, pgx.Tx) error { return nil })
				wantStale(t, err, winner)
			}
			if got := mark(t, ctx, pool, "r"); got != winner {
				t.Fatalf("mark = %v, want %v", got, winner)
			}
		})
	}
}

func TestGuardAllOrderAndDuplicates(t *testing.T) {
	ctx, pool := setup(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = postgres.GuardAll(ctx, tx, fenceOf("a", 1, "h"), fenceOf("a", 2, "h"))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("duplicate resource: err = %v, want fence.ErrInvalid", err)
	}
	if err := postgres.GuardAll(ctx, tx); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("no fences: err = %v, want fence.ErrInvalid", err)
	}
	if err := postgres.GuardAll(ctx, tx, fenceOf("b", 1, "h"), fence.Fence{Resource: "a"}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("invalid fence: err = %v, want ErrInvalid", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("bad input must send nothing, yet the transaction failed: %v", err)
	}
	if got := mark(t, ctx, pool, "b"); got.Token != 0 {
		t.Fatalf("bad input raised the mark of b to %v", got)
	}

	// A stale fence among several keeps the others' raises out once the
	// transaction is rolled back.
	raise(t, ctx, pool, fenceOf("z", 9, "h"))
	err = postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("y", 1, "h"), func(ctx context.Context, tx pgx.Tx) error {
		return postgres.GuardAll(ctx, tx, fenceOf("z", 3, "h"), fenceOf("a", 3, "h"))
	})
	wantStale(t, err, fenceOf("z", 9, "h"))
	for _, r := range []string{"a", "y"} {
		if got := mark(t, ctx, pool, r); got.Token != 0 {
			t.Fatalf("mark of %s = %v after a stale GuardAll, want none", r, got)
		}
	}
}

// ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is
// false: a stale guard holds the guard row until its transaction ends, which
// is what makes the mark it reports exact. A newer holder waits for it.
func TestStaleGuardHoldsRowLock(t *testing.T) {
	ctx, pool := setup(t)
	raise(t, ctx, pool, fenceOf("r", 5, "a"))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	wantStale(t, postgres.Guard(ctx, tx, fenceOf("r", 1, "old")), fenceOf("r", 5, "a"))

	cn := acquire(t, ctx, pool)
	done := make(chan error, 1)
	go func() {
		done <- postgres.InTx(ctx, cn, pgx.TxOptions{}, fenceOf("r", 6, "new"), func(context.Context, pgx.Tx) error { return nil })
	}()
	waitBlocked(t, ctx, pool, cn.Conn().PgConn().PID())
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("newer holder after the stale one rolled back: %v", err)
	}
}
