package pgsqlsuite

import (
	"database/sql"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(
		test{"GuardWritesOnEveryAdmission", testGuardWritesOnEveryAdmission},
		test{"MarkHolderLosesToTheRaiseItWaitedFor", testMarkHolderLosesToTheRaiseItWaitedFor},
	)
}

// rowVersion returns the transaction id that wrote the guard row of
// resource: it changes with every new row version, and only then.
func (e *env) rowVersion(resource string) string {
	e.t.Helper()
	var xmin string
	if err := e.db.QueryRowContext(e.ctx, `SELECT xmin::text FROM fencekit_guard WHERE resource = $1`, resource).Scan(&xmin); err != nil {
		e.t.Fatalf("guard row of %q: %v", resource, err)
	}
	return xmin
}

// testGuardWritesOnEveryAdmission: every admitted guard writes a new row
// version, the fence that already holds the mark included (a newer holder
// at REPEATABLE READ or SERIALIZABLE must conflict with it:
// NewerHolderSeesTheMarkHoldersLastCommit); a refused one writes none.
func testGuardWritesOnEveryAdmission(t *testing.T, d Driver) {
	e := setup(t, d)
	e.raise(fenceOf("r", 5, "a"))
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
		before := e.rowVersion("r")
		tx := e.begin(sql.LevelDefault)
		err := pgsql.Guard(e.ctx, tx, s.f)
		if (err == nil) != s.admit {
			t.Fatalf("step %d: Guard(%v) = %v, want admitted %v", i, s.f, err, s.admit)
		}
		if err == nil {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		} else {
			_ = tx.Rollback()
		}
		if after := e.rowVersion("r"); (after != before) != s.written {
			t.Errorf("step %d: Guard(%v) wrote a new guard row version: %v (xmin %s, then %s), want %v", i, s.f, after != before, before, after, s.written)
		}
	}
	if got := e.mark("r"); got != fenceOf("r", 6, "b") {
		t.Fatalf("mark = %v, want r/6/b", got)
	}
}

// testMarkHolderLosesToTheRaiseItWaitedFor: the holder of the mark guards
// again while a newer holder's transaction, which raised the mark, holds
// the guard row. The statement's snapshot still shows the old holder's
// mark; the row it locks once the newer transaction commits does not. The
// guard must judge the row it locked: stale, losing to the newer mark.
func testMarkHolderLosesToTheRaiseItWaitedFor(t *testing.T, d Driver) {
	e := setup(t, d)
	old, newer := fenceOf("r", 5, "old"), fenceOf("r", 6, "new")
	e.raise(old)
	for _, level := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted} {
		tx1 := e.begin(level)
		if err := pgsql.Guard(e.ctx, tx1, newer); err != nil {
			t.Fatal(err)
		}
		tx2 := e.begin(level)
		p2 := pid(t, e.ctx, tx2)
		done := make(chan error, 1)
		go func() { done <- pgsql.Guard(e.ctx, tx2, old) }()
		e.waitBlocked(p2)
		if err := tx1.Commit(); err != nil {
			t.Fatal(err)
		}
		wantStale(t, <-done, newer)
		_ = tx2.Rollback()
		// Once more, from the old mark, for the second level.
		e.exec(`UPDATE fencekit_guard SET token = 5, holder = 'old' WHERE resource = 'r'`)
	}
}
