package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

func TestInTxRollsBackOnFnError(t *testing.T) {
	ctx, pool := setup(t)
	boom := errors.New("boom")
	err := postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("counter", 3, "a"), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE counter SET n = 5 WHERE id = 1`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, fn's write committed", n)
	}
	if got := mark(t, ctx, pool, "counter"); got.Token != 0 {
		t.Fatalf("mark = %v, the guard committed", got)
	}
}

func TestInTxCancelledDuringFn(t *testing.T) {
	ctx, pool := setup(t)
	cctx, cancel := context.WithCancel(ctx)
	err := postgres.InTx(cctx, pool, pgx.TxOptions{}, fenceOf("counter", 3, "a"), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE counter SET n = 5 WHERE id = 1`); err != nil {
			return err
		}
		cancel()
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, the cancelled transaction committed", n)
	}
	if got := mark(t, ctx, pool, "counter"); got.Token != 0 {
		t.Fatalf("mark = %v, the cancelled transaction committed", got)
	}
}

// On a pgx.Tx, InTx runs in a savepoint: a stale fence undoes only the
// savepoint and the outer transaction goes on.
func TestInTxSavepoint(t *testing.T) {
	ctx, pool := setup(t)
	raise(t, ctx, pool, fenceOf("other", 9, "z"))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustExec(t, ctx, tx, `UPDATE counter SET n = 1 WHERE id = 1`)
	err = postgres.InTx(ctx, tx, pgx.TxOptions{}, fenceOf("other", 1, "a"), func(ctx context.Context, tx pgx.Tx) error {
		t.Error("fn ran for a stale fence")
		return nil
	})
	wantStale(t, err, fenceOf("other", 9, "z"))
	err = postgres.InTx(ctx, tx, pgx.TxOptions{IsoLevel: pgx.Serializable}, fenceOf("counter", 1, "a"), func(context.Context, pgx.Tx) error { return nil })
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("options on a pgx.Tx: err = %v, want fence.ErrInvalid", err)
	}
	err = postgres.InTx(ctx, tx, pgx.TxOptions{}, fenceOf("counter", 1, "a"), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := counter(t, ctx, pool); n != 2 {
		t.Fatalf("n = %d, want 2", n)
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	ctx, pool := setup(t)
	good := fenceOf("counter", 1, "a")
	nop := func(context.Context, pgx.Tx) error { return nil }
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	var nilPool *pgxpool.Pool
	invalidArg := []struct {
		name string
		err  error
	}{
		{"InTx nil db", postgres.InTx(ctx, nil, pgx.TxOptions{}, good, nop)},
		{"InTx typed nil pool", postgres.InTx(ctx, nilPool, pgx.TxOptions{}, good, nop)},
		{"InTx nil fn", postgres.InTx(ctx, pool, pgx.TxOptions{}, good, nil)},
		{"Guard nil tx", postgres.Guard(ctx, nil, good)},
		{"GuardAll nil tx", postgres.GuardAll(ctx, nil, good)},
		{"Exec nil db", func() error { _, err := postgres.Exec(ctx, nil, good); return err }()},
		{"Exec empty SQL", func() error { _, err := postgres.Exec(ctx, pool, good, postgres.Statement{}); return err }()},
		{"HighWater empty resource", func() error { _, err := postgres.HighWater(ctx, pool, ""); return err }()},
		{"HighWater nil db", func() error { _, err := postgres.HighWater(ctx, nil, "r"); return err }()},
		{"Retry nil fn", postgres.Retry(ctx, 1, nil)},
		{"Retry negative attempts", postgres.Retry(ctx, -1, func(context.Context) error { return nil })},
	}
	for _, c := range invalidArg {
		if !errors.Is(c.err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v, want fence.ErrInvalid", c.name, c.err)
		}
	}
	for _, bad := range []fence.Fence{{}, {Resource: "counter", Token: 0, Holder: "a"}, {Resource: "counter", Token: 1}} {
		if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, bad, nop); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("InTx(%v) = %v, want ErrInvalid", bad, err)
		}
		if _, err := postgres.Exec(ctx, pool, bad); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Exec(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	for name, err := range map[string]error{
		"InTx":      postgres.InTx(cancelled, pool, pgx.TxOptions{}, good, nop),
		"Exec":      func() error { _, err := postgres.Exec(cancelled, pool, good); return err }(),
		"HighWater": func() error { _, err := postgres.HighWater(cancelled, pool, "counter"); return err }(),
		"Retry":     postgres.Retry(cancelled, 1, func(context.Context) error { return nil }),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled ctx: err = %v, want context.Canceled", name, err)
		}
	}
	if got := mark(t, ctx, pool, "counter"); got.Token != 0 {
		t.Fatalf("bad input raised the mark to %v", got)
	}
}

func TestRetry(t *testing.T) {
	ctx := context.Background()
	calls := 0
	stale := &fence.StaleError{Fence: fenceOf("r", 1, "a"), HighWater: fenceOf("r", 2, "b")}
	err := postgres.Retry(ctx, 5, func(context.Context) error { calls++; return stale })
	if !errors.Is(err, fence.ErrStale) || calls != 1 {
		t.Fatalf("stale: err %v after %d calls, want 1 call", err, calls)
	}
	calls = 0
	conflict := &fence.ConflictError{Key: "k", Expected: 1, Actual: 2}
	err = postgres.Retry(ctx, 3, func(context.Context) error { calls++; return conflict })
	if !errors.Is(err, fence.ErrConflict) || calls != 3 {
		t.Fatalf("conflict: err %v after %d calls, want 3 calls", err, calls)
	}
	calls = 0
	err = postgres.Retry(ctx, 0, func(context.Context) error {
		calls++
		if calls < 4 {
			return &postgres.RetryableError{Err: errors.New("40001")}
		}
		return nil
	})
	if err != nil || calls != 4 {
		t.Fatalf("retryable: err %v after %d calls, want success on call 4", err, calls)
	}
}
