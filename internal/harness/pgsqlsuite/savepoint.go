package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(test{"GuardInSavepointRefused", testGuardInSavepoint})
}

// testGuardInSavepoint: a guard inside a savepoint is undone by a rollback
// to it (a nested GORM Transaction that returns an error does that), which
// takes its mark and row lock away and leaves the rest of the transaction
// unfenced: a newer holder commits, and the older holder's later write
// lands on top of it. Guard and GuardAll refuse to run inside a savepoint,
// so the older holder never writes unfenced.
func testGuardInSavepoint(t *testing.T, d Driver) {
	e := setup(t, d)
	for name, guard := range map[string]func(ctx context.Context, tx *sql.Tx, f fence.Fence) error{
		"Guard":    pgsql.Guard,
		"GuardAll": func(ctx context.Context, tx *sql.Tx, f fence.Fence) error { return pgsql.GuardAll(ctx, tx, f) },
	} {
		resource := "savepoint-" + name
		e.exec(`UPDATE counter SET n = 0 WHERE id = 1`)
		old := e.begin(sql.LevelDefault)
		if _, err := old.ExecContext(e.ctx, `SAVEPOINT nested`); err != nil {
			t.Fatal(err)
		}
		err := guard(e.ctx, old, fenceOf(resource, 1, "old"))
		if err == nil {
			// The control: what the refusal prevents.
			if _, err := old.ExecContext(e.ctx, `ROLLBACK TO SAVEPOINT nested`); err != nil {
				t.Fatal(err)
			}
			if err := pgsql.InTx(e.ctx, e.db, nil, fenceOf(resource, 2, "new"), func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `UPDATE counter SET n = 2 WHERE id = 1`)
				return err
			}); err != nil {
				t.Fatalf("%s: the newer holder: %v", name, err)
			}
			if _, err := old.ExecContext(e.ctx, `UPDATE counter SET n = 1 WHERE id = 1`); err != nil {
				t.Fatal(err)
			}
			if err := old.Commit(); err != nil {
				t.Fatal(err)
			}
			t.Errorf("%s inside a savepoint admitted token 1; after the rollback to it, token 2 committed n = 2 and token 1's write then committed n = %d", name, e.counter())
			continue
		}
		if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "savepoint") {
			t.Errorf("%s inside a savepoint = %v, want fence.ErrInvalid naming the savepoint", name, err)
		}
		_ = old.Rollback()
		// The fence that already holds the mark, again: the guard then
		// only locks the row, inside the savepoint all the same.
		same := fenceOf(resource+"-same", 1, "old")
		e.raise(same)
		again := e.begin(sql.LevelDefault)
		if _, err := again.ExecContext(e.ctx, `SAVEPOINT nested`); err != nil {
			t.Fatal(err)
		}
		if err := guard(e.ctx, again, same); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "savepoint") {
			t.Errorf("%s of the mark's own fence inside a savepoint = %v, want fence.ErrInvalid naming the savepoint", name, err)
		}
		_ = again.Rollback()
		// At the top level, the same guard is admitted.
		top := e.begin(sql.LevelDefault)
		if err := guard(e.ctx, top, fenceOf(resource, 1, "old")); err != nil {
			t.Errorf("%s at the top level: %v", name, err)
		}
		_ = top.Rollback()
	}
}
