package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// guardRow returns what every write of resource's guard row changes: its
// admissions count and its time.
func guardRow(t testing.TB, ctx context.Context, db mysql.Querier, resource string) string {
	t.Helper()
	var admissions int64
	var at string
	err := db.QueryRowContext(ctx, `SELECT admissions, CAST(updated_at AS CHAR) FROM fencekit_guard WHERE resource = ?`, resource).Scan(&admissions, &at)
	if err != nil {
		t.Fatalf("guard row of %q: %v", resource, err)
	}
	return fmt.Sprintf("%d at %s", admissions, at)
}

// TestInTxWritesTheGuardRowOnlyWhenTheMarkChanges: InTx (and Once, which
// guards the same way) presenting the fence that holds the mark leaves the
// guard row as it is; one that raises the mark writes it; a refused one
// leaves it.
func TestInTxWritesTheGuardRowOnlyWhenTheMarkChanges(t *testing.T) {
	ctx, db := setup(t)
	raise(t, ctx, db, fenceOf("r", 5, "a"))
	steps := []struct {
		f       fence.Fence
		admit   bool
		written bool
	}{
		{fenceOf("r", 5, "a"), true, false},
		{fenceOf("r", 5, "a"), true, false},
		{fenceOf("r", 5, "b"), false, false},
		{fenceOf("r", 4, "a"), false, false},
		{fenceOf("r", 6, "b"), true, true},
		{fenceOf("r", 6, "b"), true, false},
	}
	for i, s := range steps {
		before := guardRow(t, ctx, db, "r")
		// updated_at has microseconds: a write a microsecond later shows.
		time.Sleep(time.Millisecond)
		err := mysql.InTx(ctx, db, nil, s.f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
			return err
		})
		if (err == nil) != s.admit {
			t.Fatalf("step %d: InTx(%v) = %v, want admitted %v", i, s.f, err, s.admit)
		}
		if after := guardRow(t, ctx, db, "r"); (after != before) != s.written {
			t.Errorf("step %d: InTx(%v) wrote the guard row: %v (admissions and time %s, then %s), want %v", i, s.f, after != before, before, after, s.written)
		}
	}
	if got := mark(t, ctx, db, "r"); got != fenceOf("r", 6, "b") {
		t.Fatalf("mark = %v, want r/6/b", got)
	}
}

// TestInTxMarkHolderLosesToTheRaiseItWaitedFor: the holder of the mark
// runs InTx while a newer holder's transaction, which raised the mark,
// holds the guard row. A plain read in the waiting transaction would still
// see the old mark (its snapshot, at either level); the guard must judge
// the row it locks once the newer transaction commits: stale.
func TestInTxMarkHolderLosesToTheRaiseItWaitedFor(t *testing.T) {
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted} {
		t.Run(level.String(), func(t *testing.T) {
			ctx, db := setup(t)
			old, newer := fenceOf("r", 5, "old"), fenceOf("r", 6, "new")
			raise(t, ctx, db, old)
			tx1, _ := begin(t, ctx, db, level)
			if err := mysql.Guard(ctx, tx1, newer); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- mysql.InTx(ctx, db, &sql.TxOptions{Isolation: level}, old, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
					return err
				})
			}()
			waitAnyBlocked(t, ctx, db, done)
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
			wantStale(t, <-done, newer)
			if n, _ := counter(t, ctx, db); n != 0 {
				t.Fatalf("n = %d after the stale holder's InTx, want 0", n)
			}
		})
	}
}

// waitAnyBlocked polls until a connection to the test's database waits on
// a row lock, failing t after a deadline or when done delivers first (the
// call it waits for returned without waiting).
func waitAnyBlocked(t testing.TB, ctx context.Context, db mysql.Querier, done chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX x
JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id
WHERE p.DB = DATABASE() AND x.trx_state = 'LOCK WAIT'`).Scan(&n)
		if err != nil {
			t.Fatalf("INNODB_TRX: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the call returned (%v) without waiting for the row lock", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection waited on a lock")
		}
		// InnoDB refreshes what INNODB_TRX shows only when nobody read it
		// for 100 ms: polling faster would see the same snapshot forever.
		time.Sleep(150 * time.Millisecond)
	}
}

// TestGuardWritesTheGuardRowOnlyWhenTheMarkRises: Guard (and GuardAll)
// presenting the fence that holds the mark locks the guard row and writes
// nothing (the session's Handler_update, which counts each row updated,
// does not move), one that raises the mark updates it once, a refused one writes nothing and reports the mark; whatever
// the connection's found-rows flag and whether statements are prepared
// on the server or interpolated.
func TestGuardWritesTheGuardRowOnlyWhenTheMarkRises(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		for _, interpolate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/interpolateParams=%v", foundRowsName(foundRows), interpolate), func(t *testing.T) {
				cfg := testenv.MySQLConfig(t)
				cfg.ClientFoundRows = foundRows
				cfg.InterpolateParams = interpolate
				ctx, db := setupWith(t, cfg)
				raise(t, ctx, db, fenceOf("r", 5, "a"))
				steps := []struct {
					f      fence.Fence
					all    bool // through GuardAll
					admit  bool
					writes int64 // rows updated
				}{
					{fenceOf("r", 5, "a"), false, true, 0},
					{fenceOf("r", 5, "a"), true, true, 0},
					{fenceOf("r", 5, "b"), false, false, 0},
					{fenceOf("r", 4, "a"), true, false, 0},
					{fenceOf("r", 6, "b"), false, true, 1},
					{fenceOf("r", 6, "b"), false, true, 0},
					{fenceOf("r", 7, "c"), true, true, 1},
					{fenceOf("new", 1, "c"), false, true, 0}, // inserted
					{fenceOf("new", 1, "c"), false, true, 0},
				}
				for i, s := range steps {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					before := rowUpdates(t, ctx, tx)
					if s.all {
						err = mysql.GuardAll(ctx, tx, s.f)
					} else {
						err = mysql.Guard(ctx, tx, s.f)
					}
					written := rowUpdates(t, ctx, tx) - before
					if s.admit {
						if err != nil {
							t.Fatalf("step %d: guard(%v) = %v, want admitted", i, s.f, err)
						}
						if err := tx.Commit(); err != nil {
							t.Fatal(err)
						}
					} else {
						_ = tx.Rollback()
						prev := steps[i-1].f
						if prev.Resource != s.f.Resource {
							t.Fatalf("step %d: the table is out of order", i)
						}
						wantStale(t, err, mark(t, ctx, db, s.f.Resource))
					}
					if written != s.writes {
						t.Errorf("step %d: guard(%v) updated %d rows, want %d", i, s.f, written, s.writes)
					}
				}
				if got := mark(t, ctx, db, "r"); got != fenceOf("r", 7, "c") {
					t.Fatalf("mark = %v, want r/7/c", got)
				}
			})
		}
	}
}

// rowUpdates is the session's Handler_update: the rows tx's connection
// has updated. (Handler_write would count every INSERT ... ON DUPLICATE
// KEY UPDATE, which tries to insert before it finds the row, and
// INNODB_TRX's trx_rows_modified is a cache refreshed every 100 ms.)
func rowUpdates(t testing.TB, ctx context.Context, tx *sql.Tx) int64 {
	t.Helper()
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME = 'HANDLER_UPDATE'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInTxGuardIsOneStatement: InTx's guard is one statement whether the
// mark holds the fence (nothing written) or is raised (the guard row written
// once): fn runs after BEGIN and the guard. Only a refusal adds a read of
// the mark it lost to (BEGIN, the guard, the read, ROLLBACK). It answers alike whatever the connection's found-rows flag and
// whether statements are prepared on the server or interpolated.
func TestInTxGuardIsOneStatement(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		for _, interpolate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/interpolateParams=%v", foundRowsName(foundRows), interpolate), func(t *testing.T) {
				cfg := testenv.MySQLConfig(t)
				cfg.ClientFoundRows = foundRows
				cfg.InterpolateParams = interpolate
				ctx, db := setupWith(t, cfg)
				db.SetMaxOpenConns(1) // the session's counters are the calls'
				raise(t, ctx, db, fenceOf("r", 5, "a"))
				steps := []struct {
					f          fence.Fence
					admit      bool
					statements int64 // before fn, or in all when refused
					writes     int64 // guard rows updated
				}{
					{fenceOf("r", 5, "a"), true, 2, 0},
					{fenceOf("r", 6, "b"), true, 2, 1},
					{fenceOf("r", 6, "b"), true, 2, 0},
					{fenceOf("r", 6, "a"), false, 4, 0},
					{fenceOf("r", 5, "b"), false, 4, 0},
					{fenceOf("r", 7, "a"), true, 2, 1},
				}
				for i, s := range steps {
					before := sessionCounters(t, ctx, db)
					var inside counters
					err := mysql.InTx(ctx, db, nil, s.f, func(ctx context.Context, tx *sql.Tx) error {
						inside = sessionCounters(t, ctx, tx)
						return nil
					})
					if (err == nil) != s.admit {
						t.Fatalf("step %d: InTx(%v) = %v, want admitted %v", i, s.f, err, s.admit)
					}
					if !s.admit {
						inside = sessionCounters(t, ctx, db)
						wantStale(t, err, mark(t, ctx, db, "r"))
					}
					// Each read of the counters is a statement itself.
					if got := inside.statements - before.statements - 1; got != s.statements {
						t.Errorf("step %d: InTx(%v) sent %d statements, want %d", i, s.f, got, s.statements)
					}
					if got := inside.updates - before.updates; got != s.writes {
						t.Errorf("step %d: InTx(%v) updated %d rows, want %d", i, s.f, got, s.writes)
					}
				}
				if got := mark(t, ctx, db, "r"); got != fenceOf("r", 7, "a") {
					t.Fatalf("mark = %v, want r/7/a", got)
				}
			})
		}
	}
}

// counters are a session's statements (those that read or write rows, and
// BEGIN) and rows updated (Handler_update).
type counters struct{ statements, updates int64 }

func sessionCounters(t testing.TB, ctx context.Context, db mysql.Querier) counters {
	t.Helper()
	var c counters
	err := db.QueryRowContext(ctx, `SELECT
    SUM(IF(VARIABLE_NAME IN ('COM_SELECT', 'COM_UPDATE', 'COM_INSERT', 'COM_BEGIN', 'COM_COMMIT', 'COM_ROLLBACK'), VARIABLE_VALUE, 0)),
    SUM(IF(VARIABLE_NAME = 'HANDLER_UPDATE', VARIABLE_VALUE, 0))
FROM information_schema.SESSION_STATUS`).Scan(&c.statements, &c.updates)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInTxGuardAnswerIsTheStatementsOwn: the insert id InTx's guard reads
// is the one its own statement set. A session's LAST_INSERT_ID() keeps the
// last value set, but a reply carries it only for the statement that set
// it: a resource without a guard row, guarded right after another
// resource's mark held on the same connection, still gets its row (and its
// mark) rather than being taken as held.
func TestInTxGuardAnswerIsTheStatementsOwn(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(foundRowsName(foundRows), func(t *testing.T) {
			cfg := testenv.MySQLConfig(t)
			cfg.ClientFoundRows = foundRows
			ctx, db := setupWith(t, cfg)
			db.SetMaxOpenConns(1)
			raise(t, ctx, db, fenceOf("held", 5, "a"))
			for _, f := range []fence.Fence{fenceOf("held", 5, "a"), fenceOf("new", 1, "b"), fenceOf("held", 4, "a"), fenceOf("other", 1, "c")} {
				_ = mysql.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil })
				if f.Resource == "held" {
					continue
				}
				if got := mark(t, ctx, db, f.Resource); got != f {
					t.Fatalf("mark of %q after InTx(%v) = %v, want the fence", f.Resource, f, got)
				}
			}
		})
	}
}

// TestOnceWritesOnlyItsRecord: Once under the fence that holds the mark
// writes its completion record and nothing else before fn runs (the guard
// row is locked, not written), in BEGIN, the guard and the record's
// INSERT; a key already done writes nothing.
func TestOnceWritesOnlyItsRecord(t *testing.T) {
	ctx, db := setup(t)
	db.SetMaxOpenConns(1)
	f := fenceOf("r", 5, "a")
	raise(t, ctx, db, f)
	for i, key := range []string{"k1", "k1", "k2"} {
		before := sessionCounters(t, ctx, db)
		writesBefore := rowWrites(t, ctx, db)
		var inside counters
		var writesInside int64
		ran, err := mysql.Once(ctx, db, f, key, func(ctx context.Context, tx *sql.Tx) error {
			inside = sessionCounters(t, ctx, tx)
			writesInside = rowWrites(t, ctx, tx)
			return nil
		})
		if err != nil || ran != (i != 1) {
			t.Fatalf("Once(%q) #%d = %v, %v", key, i, ran, err)
		}
		if !ran {
			continue
		}
		// Each read of the counters is a statement itself; rowWrites too.
		if got := inside.statements - before.statements - 2; got != 3 {
			t.Errorf("Once(%q) sent %d statements before fn, want 3 (BEGIN, guard, record)", key, got)
		}
		if got := inside.updates - before.updates; got != 0 {
			t.Errorf("Once(%q) updated %d rows before fn, want 0", key, got)
		}
		if got := writesInside - writesBefore; got != 1 {
			t.Errorf("Once(%q) inserted %d rows before fn, want 1 (its record)", key, got)
		}
	}
}

// rowWrites is the session's Handler_write: rows inserted.
func rowWrites(t testing.TB, ctx context.Context, db mysql.Querier) int64 {
	t.Helper()
	var n int64
	err := db.QueryRowContext(ctx, `SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME = 'HANDLER_WRITE'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
