package postgres_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestGuardInSavepointRefused: a guard inside a savepoint (pgx's Tx.Begin
// on a transaction makes one) is undone when the savepoint rolls back,
// which takes its mark and row lock away and leaves the rest of the
// transaction unfenced: a newer holder commits, and the older holder's
// later write lands on top of it. Guard and GuardAll refuse to run inside
// a savepoint, so the older holder never writes unfenced; at the top level
// they admit as before.
func TestGuardInSavepointRefused(t *testing.T) {
	ctx, pool := setup(t)
	for name, guard := range map[string]func(ctx context.Context, tx pgx.Tx, f fence.Fence) error{
		"Guard":    postgres.Guard,
		"GuardAll": func(ctx context.Context, tx pgx.Tx, f fence.Fence) error { return postgres.GuardAll(ctx, tx, f) },
		"GuardAll of two": func(ctx context.Context, tx pgx.Tx, f fence.Fence) error {
			g := f
			g.Resource += "-other"
			return postgres.GuardAll(ctx, tx, g, f)
		},
	} {
		resource := "savepoint-" + name
		mustExec(t, ctx, pool, `UPDATE counter SET n = 0 WHERE id = 1`)
		old, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		nested, err := old.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = guard(ctx, nested, fenceOf(resource, 1, "old"))
		if err == nil {
			// The control: what the refusal prevents.
			if err := nested.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			err := postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf(resource, 2, "new"), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE counter SET n = 2 WHERE id = 1`)
				return err
			})
			if err != nil {
				t.Fatalf("%s: the newer holder: %v", name, err)
			}
			mustExec(t, ctx, old, `UPDATE counter SET n = 1 WHERE id = 1`)
			if err := old.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			n, _ := counter(t, ctx, pool)
			t.Errorf("%s inside a savepoint admitted token 1; after the rollback to it, token 2 committed n = 2 and token 1's write then committed n = %d", name, n)
			continue
		}
		if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "savepoint") {
			t.Errorf("%s inside a savepoint = %v, want fence.ErrInvalid naming the savepoint", name, err)
		}
		_ = old.Rollback(ctx)
		// The fence that already holds the mark, again: the guard then
		// rewrites the row with the same mark, inside the savepoint all
		// the same.
		same := fenceOf(resource+"-same", 1, "old")
		raise(t, ctx, pool, same)
		if name == "GuardAll of two" {
			other := same
			other.Resource += "-other"
			raise(t, ctx, pool, other)
		}
		again, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		againNested, err := again.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := guard(ctx, againNested, same); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "savepoint") {
			t.Errorf("%s of the mark's own fence inside a savepoint = %v, want fence.ErrInvalid naming the savepoint", name, err)
		}
		_ = again.Rollback(ctx)
		top, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := guard(ctx, top, fenceOf(resource, 1, "old")); err != nil {
			t.Errorf("%s at the top level: %v", name, err)
		}
		_ = top.Rollback(ctx)
	}
}

// TestGuardCheckRidesInOneFlight: the savepoint check goes in the guard's
// batch, so Guard in a transaction of the caller's costs one flight of
// messages, as the guard statement alone did.
func TestGuardCheckRidesInOneFlight(t *testing.T) {
	ctx, pool := setup(t)
	var writes, reads atomic.Int64
	cfg := pool.Config().ConnConfig.Copy()
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes, reads: &reads}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	f := fenceOf("flight", 1, "h")
	for i := range 2 { // the first run warms the statement cache
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w0 := writes.Load()
		if err := postgres.Guard(ctx, tx, f); err != nil {
			t.Fatal(err)
		}
		w := writes.Load() - w0
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 1 && w != 1 {
			t.Fatalf("Guard took %d flights, want 1", w)
		}
	}
}
