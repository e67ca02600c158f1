package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// rowVersion returns the transaction id that wrote the guard row of
// resource: it changes with every new row version, and only then.
func rowVersion(t testing.TB, ctx context.Context, db postgres.Querier, resource string) string {
	t.Helper()
	var xmin string
	if err := db.QueryRow(ctx, `SELECT xmin::text FROM fencekit_guard WHERE resource = $1`, resource).Scan(&xmin); err != nil {
		t.Fatalf("guard row of %q: %v", resource, err)
	}
	return xmin
}

// guardPaths are the ways a pgx caller is guarded: the transaction's guard
// statement (InTx, Guard) and the pipelined batch's function (Exec, Query).
var guardPaths = []struct {
	name  string
	guard func(ctx context.Context, db postgres.Beginner, f fence.Fence) error
}{
	{"InTx", func(ctx context.Context, db postgres.Beginner, f fence.Fence) error {
		return postgres.InTx(ctx, db, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
			return err
		})
	}},
	{"Exec", func(ctx context.Context, db postgres.Beginner, f fence.Fence) error {
		_, err := postgres.Exec(ctx, db.(postgres.Batcher), f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`})
		return err
	}},
}

// TestGuardWritesOnEveryAdmission: on both paths, every admitted guard
// writes a new guard row version, the fence that already holds the mark
// included (a newer holder at REPEATABLE READ or SERIALIZABLE must conflict
// with it: TestNewerHolderSeesTheMarkHoldersLastCommit); a refused one
// writes none.
func TestGuardWritesOnEveryAdmission(t *testing.T) {
	for _, path := range guardPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx, pool := setup(t)
			raise(t, ctx, pool, fenceOf("r", 5, "a"))
			steps := []struct {
				f       fence.Fence
				admit   bool
				written bool
			}{
				{fenceOf("r", 5, "a"), true, true},
				{fenceOf("r", 5, "a"), true, true},
				{fenceOf("r", 5, "b"), false, false},
				{fenceOf("r", 4, "a"), false, false},
				{fenceOf("r", 6, "b"), true, true},
				{fenceOf("r", 6, "b"), true, true},
			}
			for i, s := range steps {
				before := rowVersion(t, ctx, pool, "r")
				err := path.guard(ctx, pool, s.f)
				if (err == nil) != s.admit {
					t.Fatalf("step %d: %v = %v, want admitted %v", i, s.f, err, s.admit)
				}
				if after := rowVersion(t, ctx, pool, "r"); (after != before) != s.written {
					t.Errorf("step %d: %v wrote a new guard row version: %v (xmin %s, then %s), want %v", i, s.f, after != before, before, after, s.written)
				}
			}
			if got := mark(t, ctx, pool, "r"); got != fenceOf("r", 6, "b") {
				t.Fatalf("mark = %v, want r/6/b", got)
			}
		})
	}
}

// TestMarkHolderLosesToTheRaiseItWaitedFor: on both paths, the holder of
// the mark is guarded again while a newer holder's transaction, which
// raised the mark, holds the guard row. The snapshot of the waiting
// statement still shows the old mark; the row it locks once the newer
// transaction commits does not, and the guard must judge that row: stale.
func TestMarkHolderLosesToTheRaiseItWaitedFor(t *testing.T) {
	for _, path := range guardPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx, pool := setup(t)
			old, newer := fenceOf("r", 5, "old"), fenceOf("r", 6, "new")
			raise(t, ctx, pool, old)
			tx1, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback(ctx)
			if err := postgres.Guard(ctx, tx1, newer); err != nil {
				t.Fatal(err)
			}
			c := acquire(t, ctx, pool)
			done := make(chan error, 1)
			go func() { done <- path.guard(ctx, c.Conn(), old) }()
			waitBlocked(t, ctx, pool, c.Conn().PgConn().PID())
			if err := tx1.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			wantStale(t, <-done, newer)
			if n, _ := counter(t, ctx, pool); n != 0 {
				t.Fatalf("n = %d after the stale holder's write, want 0", n)
			}
		})
	}
}
