package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestInTxFollowingWriteIsOneLockingRead: once InTx admitted a fence
// through a handle, the next InTx of that fence through it is judged by a
// locking read of the guard row that updates nothing: admitted in BEGIN
// and the read; refused as stale in BEGIN, the read and ROLLBACK, with the
// mark it read; a mark below the fence (the row was reset) raised by a
// second statement; a missing row created. Changes of the row behind the
// process's back only ever cost statements, never a wrong answer.
func TestInTxFollowingWriteIsOneLockingRead(t *testing.T) {
	cfg := testenv.MySQLConfig(t)
	ctx, db := setupWith(t, cfg.Clone())
	db.SetMaxOpenConns(1) // the session's counters are the calls'
	other := testenv.OpenMySQL(t, cfg.Clone())
	raise(t, ctx, other, fenceOf("r", 4, "z")) // the guard row exists
	resetTo := func(token int64, holder string) {
		mustExec(t, ctx, db, "UPDATE fencekit_guard SET token = ?, holder = ? WHERE resource = 'r'", token, holder)
	}
	steps := []struct {
		name    string
		before  func()
		f       fence.Fence
		stale   fence.Fence // the mark it loses to, if refused
		sent    int64       // statements before fn, or in all when refused (BEGIN and ROLLBACK included)
		updates int64       // UPDATE statements among them
		after   fence.Fence // the mark after the call
	}{
		{"first write of the lease", nil, fenceOf("r", 5, "a"), fence.Fence{}, 2, 1, fenceOf("r", 5, "a")},
		{"following write", nil, fenceOf("r", 5, "a"), fence.Fence{}, 2, 0, fenceOf("r", 5, "a")},
		{"following write again", nil, fenceOf("r", 5, "a"), fence.Fence{}, 2, 0, fenceOf("r", 5, "a")},
		{"newer holder elsewhere", func() { raise(t, ctx, other, fenceOf("r", 6, "b")) },
			fenceOf("r", 5, "a"), fenceOf("r", 6, "b"), 3, 0, fenceOf("r", 6, "b")},
		{"refused fence is forgotten", nil, fenceOf("r", 5, "a"), fenceOf("r", 6, "b"), 4, 1, fenceOf("r", 6, "b")},
		{"new lease", nil, fenceOf("r", 7, "a"), fence.Fence{}, 2, 1, fenceOf("r", 7, "a")},
		{"row reset below the fence", func() { resetTo(0, "") }, fenceOf("r", 7, "a"), fence.Fence{}, 3, 1, fenceOf("r", 7, "a")},
		{"following write after the raise", nil, fenceOf("r", 7, "a"), fence.Fence{}, 2, 0, fenceOf("r", 7, "a")},
		{"same token, other holder", func() { resetTo(7, "c") }, fenceOf("r", 7, "a"), fenceOf("r", 7, "c"), 3, 0, fenceOf("r", 7, "c")},
		{"new lease again", nil, fenceOf("r", 8, "a"), fence.Fence{}, 2, 1, fenceOf("r", 8, "a")},
		{"newer token set by hand", func() { resetTo(9, "a") }, fenceOf("r", 8, "a"), fenceOf("r", 9, "a"), 3, 0, fenceOf("r", 9, "a")},
		{"new lease after it", nil, fenceOf("r", 10, "d"), fence.Fence{}, 2, 1, fenceOf("r", 10, "d")},
	}
	for i, s := range steps {
		if s.before != nil {
			s.before()
		}
		before := sessionCounters(t, ctx, db)
		updatesBefore := updateStatements(t, ctx, db)
		var inside counters
		var updatesInside int64
		err := mysql.InTx(ctx, db, nil, s.f, func(ctx context.Context, tx *sql.Tx) error {
			inside = sessionCounters(t, ctx, tx)
			updatesInside = updateStatements(t, ctx, tx)
			return nil
		})
		if s.stale.Token != 0 {
			wantStale(t, err, s.stale)
			inside = sessionCounters(t, ctx, db)
			updatesInside = updateStatements(t, ctx, db)
		} else if err != nil {
			t.Fatalf("step %d (%s): InTx(%v) = %v", i, s.name, s.f, err)
		}
		// Each read of the counters is a statement itself.
		if got := inside.statements - before.statements - 2; got != s.sent {
			t.Errorf("step %d (%s): InTx(%v) sent %d statements, want %d", i, s.name, s.f, got, s.sent)
		}
		if got := updatesInside - updatesBefore; got != s.updates {
			t.Errorf("step %d (%s): InTx(%v) sent %d UPDATEs, want %d", i, s.name, s.f, got, s.updates)
		}
		if got := mark(t, ctx, db, "r"); got != s.after {
			t.Fatalf("step %d (%s): mark = %v, want %v", i, s.name, got, s.after)
		}
	}

	// A missing row is created, whatever the memory says.
	mustExec(t, ctx, db, "DELETE FROM fencekit_guard WHERE resource = 'r'")
	raise(t, ctx, db, fenceOf("r", 10, "d"))
	if got := mark(t, ctx, db, "r"); got != fenceOf("r", 10, "d") {
		t.Fatalf("mark after the row was deleted = %v, want r/10/d", got)
	}
}

// updateStatements is the session's UPDATE statements (Com_update).
func updateStatements(t testing.TB, ctx context.Context, db mysql.Querier) int64 {
	t.Helper()
	var n int64
	err := db.QueryRowContext(ctx, `SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME = 'COM_UPDATE'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
