package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(
		test{"GuardAdmission", testGuardAdmission},
		test{"TokenLimit", testTokenLimit},
		test{"ResourceAndHolderLimits", testLimits},
		test{"GuardTextIsExact", testGuardTextIsExact},
		test{"RowLockHeldToEnd", testRowLockHeldToEnd},
		test{"StaleGuardHoldsRowLock", testStaleGuardHoldsRowLock},
		test{"InTxAndOnceLoseToTheRaiseTheyWaitedFor", testInTxAndOnceLose},
		test{"GuardAllOrder", testGuardAllOrder},
		test{"DeadlockIsRetryable", testDeadlockIsRetryable},
		test{"RolledBackRaiseIsNoMark", testRolledBackRaise},
		test{"NotMigrated", testNotMigrated},
		test{"Before00009", testBefore00009},
	)
}

// testGuardAdmission walks the admission rule: a first fence, the same
// fence again, a newer token, and the two stale cases (older token, same
// token from another holder), each refusal carrying the mark.
func testGuardAdmission(t *testing.T, d Driver) {
	e := setup(t, d)
	if got := e.mark("r"); got.Token != 0 {
		t.Fatalf("mark before any guard = %v, want none", got)
	}
	steps := []struct {
		f     fence.Fence
		admit bool
	}{
		{fenceOf("r", 5, "a"), true},
		{fenceOf("r", 5, "a"), true},
		{fenceOf("r", 4, "b"), false},
		{fenceOf("r", 5, "b"), false},
		{fenceOf("r", 6, "b"), true},
		{fenceOf("r", 5, "a"), false},
	}
	hwm := fence.Fence{}
	for i, s := range steps {
		tx := e.begin(sql.LevelDefault)
		err := pgsql.Guard(e.ctx, tx, s.f)
		switch {
		case s.admit && err != nil:
			t.Fatalf("step %d: Guard(%v) = %v, want admitted", i, s.f, err)
		case !s.admit:
			wantStale(t, err, hwm)
			if !strings.HasPrefix(err.Error(), "pgsql: guard: ") {
				t.Errorf("stale error %q does not start with \"pgsql: guard: \"", err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("step %d: commit: %v", i, err)
		}
		if s.admit {
			hwm = s.f
		}
		if got := e.mark("r"); got.Token != hwm.Token || got.Holder != hwm.Holder {
			t.Fatalf("step %d: mark = %v, want %v", i, got, hwm)
		}
	}
}

// testTokenLimit: the largest token a bigint holds is admitted, read back
// exactly, and refuses every other holder.
func testTokenLimit(t *testing.T, d Driver) {
	e := setup(t, d)
	top := fenceOf("r", math.MaxInt64, "top")
	e.raise(fenceOf("r", math.MaxInt64-1, "below"))
	e.raise(top)
	if got := e.mark("r"); got.Token != math.MaxInt64 || got.Holder != "top" {
		t.Fatalf("mark = %v, want token 2^63-1", got)
	}
	e.raise(top) // the same fence again
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", math.MaxInt64, "other"), func(context.Context, *sql.Tx) error { return nil })
	wantStale(t, err, top)
}

// testLimits: a resource of fence.MaxResourceLen bytes and a 64 KiB holder
// are stored and compared exactly; one byte more of resource is refused
// before anything is sent.
func testLimits(t *testing.T, d Driver) {
	e := setup(t, d)
	r := strings.Repeat("r", fence.MaxResourceLen-3) + "é" + "x" // multi-byte near the end
	holder := strings.Repeat("h", 64<<10)
	f := fenceOf(r, 7, holder)
	e.raise(f)
	if got := e.mark(r); got.Token != 7 || got.Holder != holder {
		t.Fatalf("mark of the longest resource = token %d, holder of %d bytes", got.Token, len(got.Holder))
	}
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf(r, 7, holder[:len(holder)-1]), func(context.Context, *sql.Tx) error { return nil })
	wantStale(t, err, f)
	long := r + "x"
	err = pgsql.InTx(e.ctx, e.db, nil, fenceOf(long, 8, "h"), func(context.Context, *sql.Tx) error { return nil })
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("resource of %d bytes: err = %v, want ErrInvalid", len(long), err)
	}
	if _, err := pgsql.HighWater(e.ctx, e.db, long); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("HighWater of %d bytes: err = %v, want ErrInvalid", len(long), err)
	}
}

// testGuardTextIsExact: InTx's guard keeps the resource and holder byte
// for byte, whatever quotes, backslashes or dollar signs they hold: the
// mark reads back the same, the same fence is admitted again and a holder
// one byte longer is refused.
func testGuardTextIsExact(t *testing.T, d Driver) {
	e := setup(t, d)
	for i, s := range []string{
		`it's`, `back\slash\`, `\'`, `$$dollar$$`, `$f$`, `E'x'`, "汉字 é", "tab\there\n",
		`'); UPDATE counter SET n = 100 WHERE id = 1; --`, `\x27`,
	} {
		f := fenceOf(s, int64(i+1), s)
		if err := pgsql.InTx(e.ctx, e.db, nil, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got := e.mark(s); got != f {
			t.Fatalf("mark of %q = %v, want %v", s, got, f)
		}
		if err := pgsql.InTx(e.ctx, e.db, nil, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
			t.Fatalf("%q again: %v", s, err)
		}
		err := pgsql.InTx(e.ctx, e.db, nil, fenceOf(s, int64(i+1), s+"x"), func(context.Context, *sql.Tx) error { return nil })
		wantStale(t, err, f)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d, want 0", n)
	}
}

// testRowLockHeldToEnd: a newer holder's guard waits for the transaction
// that holds the guard row until that transaction commits, then is
// admitted; the mark it sees is the committed one.
func testRowLockHeldToEnd(t *testing.T, d Driver) {
	e := setup(t, d)
	tx1 := e.begin(sql.LevelDefault)
	if err := pgsql.Guard(e.ctx, tx1, fenceOf("r", 1, "a")); err != nil {
		t.Fatal(err)
	}
	// The first holder's work, after its guard, still inside tx1.
	if _, err := tx1.ExecContext(e.ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	tx2 := e.begin(sql.LevelDefault)
	p2 := pid(t, e.ctx, tx2)
	done := make(chan error, 1)
	go func() { done <- pgsql.Guard(e.ctx, tx2, fenceOf("r", 2, "b")) }()
	e.waitBlocked(p2)
	select {
	case err := <-done:
		t.Fatalf("the second guard returned (%v) while the first transaction holds the row", err)
	default:
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second guard after the first committed: %v", err)
	}
	var n int64
	if err := tx2.QueryRowContext(e.ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after its guard the second holder reads n = %d (%v), want the first's committed 1", n, err)
	}
	if err := tx2.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := e.mark("r"); got.Token != 2 {
		t.Fatalf("mark = %v, want token 2", got)
	}
}

// testStaleGuardHoldsRowLock: an older holder waits for the newer one's
// transaction and is then refused with the mark that transaction committed.
func testStaleGuardHoldsRowLock(t *testing.T, d Driver) {
	e := setup(t, d)
	tx1 := e.begin(sql.LevelDefault)
	newer := fenceOf("r", 9, "new")
	if err := pgsql.Guard(e.ctx, tx1, newer); err != nil {
		t.Fatal(err)
	}
	tx2 := e.begin(sql.LevelDefault)
	p2 := pid(t, e.ctx, tx2)
	done := make(chan error, 1)
	go func() { done <- pgsql.Guard(e.ctx, tx2, fenceOf("r", 3, "old")) }()
	e.waitBlocked(p2)
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	wantStale(t, <-done, newer)
}

// testInTxAndOnceLose is testMarkHolderLosesToTheRaiseItWaitedFor for the
// raising guard of InTx and Once: the fence that holds the mark meets a newer holder that raised the
// mark and has not committed: InTx waits for it, then judges the row
// version it locked, not its statement's snapshot, which still shows its
// own fence as the mark. At READ COMMITTED a guard that judged the
// snapshot would admit it and run fn after the newer holder's commit. At
// REPEATABLE READ the wait ends in a serialization failure instead.
func testInTxAndOnceLose(t *testing.T, d Driver) {
	e := setup(t, d)
	older, newer := fenceOf("r", 5, "old"), fenceOf("r", 6, "new")
	if err := pgsql.InTx(e.ctx, e.db, nil, older, increment); err != nil {
		t.Fatal(err)
	}
	for _, call := range []string{"InTx", "Once"} {
		tx1 := e.begin(sql.LevelDefault)
		if err := pgsql.Guard(e.ctx, tx1, newer); err != nil {
			t.Fatal(err)
		}
		p1 := pid(t, e.ctx, tx1)
		started := make(chan struct{})
		done := make(chan error, 1)
		fn := func(context.Context, *sql.Tx) error { return errors.New("fn ran under a fence the mark had passed") }
		go func() {
			close(started)
			if call == "InTx" {
				done <- pgsql.InTx(e.ctx, e.db, nil, older, fn)
				return
			}
			_, err := pgsql.Once(e.ctx, e.db, older, "marked-"+call, fn)
			done <- err
		}()
		<-started
		e.waitBlockedBy(p1)
		if err := tx1.Commit(); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if mark, ok := fence.LostTo(err); !ok || mark != newer {
			t.Fatalf("%s under the fence the newer holder's commit passed: %v; want a refusal that lost to %v", call, err, newer)
		}
		older, newer = newer, fenceOf("r", int64(newer.Token)+1, "new")
	}
	// At REPEATABLE READ the guard's snapshot is its transaction's: the
	// newer holder's commit while the guard waited fails it as a
	// serialization failure, for Retry to run again and be refused.
	tx1 := e.begin(sql.LevelDefault)
	if err := pgsql.Guard(e.ctx, tx1, newer); err != nil {
		t.Fatal(err)
	}
	p1 := pid(t, e.ctx, tx1)
	done := make(chan error, 1)
	go func() {
		done <- pgsql.InTx(e.ctx, e.db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, older,
			func(context.Context, *sql.Tx) error { return errors.New("fn ran under a fence the mark had passed") })
	}()
	e.waitBlockedBy(p1)
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, pgsql.ErrRetryable) {
		t.Fatalf("InTx at REPEATABLE READ under the fence the newer holder's commit passed: %v; want ErrRetryable", err)
	}
	if n := e.counter(); n != 1 {
		t.Fatalf("counter = %d, want 1 (the first InTx alone)", n)
	}
}

// testGuardAllOrder: GuardAll admits a set given in any order, refuses a
// resource named twice before sending, and reports the first stale fence.
func testGuardAllOrder(t *testing.T, d Driver) {
	e := setup(t, d)
	tx := e.begin(sql.LevelDefault)
	if err := pgsql.GuardAll(e.ctx, tx, fenceOf("b", 1, "h"), fenceOf("a", 1, "h")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if e.mark("a").Token != 1 || e.mark("b").Token != 1 {
		t.Fatal("GuardAll did not raise both marks")
	}
	tx = e.begin(sql.LevelDefault)
	if err := pgsql.GuardAll(e.ctx, tx, fenceOf("a", 2, "h"), fenceOf("a", 3, "h")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("resource twice: %v, want ErrInvalid", err)
	}
	if err := pgsql.GuardAll(e.ctx, tx, fenceOf("c", 2, "h"), fenceOf("b", 0, "h")); !errors.Is(err, fence.ErrInvalid) ||
		!strings.HasPrefix(err.Error(), "pgsql: GuardAll: invalid fence: ") {
		t.Fatalf("invalid fence: %v, want ErrInvalid naming GuardAll", err)
	}
	// Nothing was sent: the transaction is still usable.
	wantStale(t, pgsql.GuardAll(e.ctx, tx, fenceOf("c", 2, "h"), fenceOf("b", 1, "x")), fenceOf("b", 1, "h"))
}

// testDeadlockIsRetryable guards two resources one by one in opposite
// orders from two transactions: PostgreSQL picks a deadlock victim
// (40P01), whose error matches ErrRetryable.
func testDeadlockIsRetryable(t *testing.T, d Driver) {
	e := setup(t, d)
	tx1 := e.begin(sql.LevelDefault)
	tx2 := e.begin(sql.LevelDefault)
	p2 := pid(t, e.ctx, tx2)
	if err := pgsql.Guard(e.ctx, tx1, fenceOf("a", 1, "h1")); err != nil {
		t.Fatal(err)
	}
	if err := pgsql.Guard(e.ctx, tx2, fenceOf("b", 1, "h2")); err != nil {
		t.Fatal(err)
	}
	err2 := make(chan error, 1)
	go func() { err2 <- pgsql.Guard(e.ctx, tx2, fenceOf("a", 2, "h2")) }()
	e.waitBlocked(p2)
	err1 := make(chan error, 1)
	go func() { err1 <- pgsql.Guard(e.ctx, tx1, fenceOf("b", 2, "h1")) }()
	// The victim returns first and rolling it back lets the other finish;
	// but PostgreSQL frees the victim's locks when it reports the deadlock,
	// so the other may have returned too by the time either is read. Tell
	// them apart by their errors, not by which arrived first.
	var victim, other error
	select {
	case e1 := <-err1:
		if e1 == nil {
			victim, other = <-err2, e1
			_ = tx2.Rollback()
		} else {
			_ = tx1.Rollback()
			victim, other = e1, <-err2
		}
	case e2 := <-err2:
		if e2 == nil {
			victim, other = <-err1, e2
			_ = tx1.Rollback()
		} else {
			_ = tx2.Rollback()
			victim, other = e2, <-err1
		}
	}
	var re *pgsql.RetryableError
	if !errors.Is(victim, pgsql.ErrRetryable) || !errors.As(victim, &re) {
		t.Fatalf("victim's err = %v, want ErrRetryable", victim)
	}
	if other != nil {
		t.Fatalf("the other transaction's guard = %v, want admitted", other)
	}
}

// testRolledBackRaise: a guard whose transaction rolls back (fn failed)
// leaves no mark, so an older fence is still admitted afterwards.
func testRolledBackRaise(t *testing.T, d Driver) {
	e := setup(t, d)
	e.raise(fenceOf("r", 1, "a"))
	boom := errors.New("fn failed")
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 10, "b"), func(ctx context.Context, tx *sql.Tx) error {
		if err := increment(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	if got := e.mark("r"); got.Token != 1 {
		t.Fatalf("mark after rollback = %v, want token 1", got)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d after rollback, want 0", n)
	}
	e.raise(fenceOf("r", 2, "c"))
}

// testNotMigrated: fencekit's own missing objects match ErrNotMigrated and
// say what to run; a missing table of the caller's does not.
func testNotMigrated(t *testing.T, d Driver) {
	e := bare(t, d)
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 1, "h"), func(context.Context, *sql.Tx) error { return nil })
	if !errors.Is(err, pgsql.ErrNotMigrated) || !strings.Contains(err.Error(), "migrations.Up(ctx, db)") {
		t.Fatalf("InTx on an unmigrated schema = %v, want ErrNotMigrated naming migrations.Up", err)
	}
	if _, err := pgsql.HighWater(e.ctx, e.db, "r"); !errors.Is(err, pgsql.ErrNotMigrated) {
		t.Fatalf("HighWater = %v, want ErrNotMigrated", err)
	}
	if _, err := pgsql.LookupOnce(e.ctx, e.db, "k"); !errors.Is(err, pgsql.ErrNotMigrated) {
		t.Fatalf("LookupOnce = %v, want ErrNotMigrated", err)
	}
	e2 := setup(t, d)
	err = pgsql.InTx(e2.ctx, e2.db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE no_such_table SET x = 1`)
		return err
	})
	if err == nil || errors.Is(err, pgsql.ErrNotMigrated) {
		t.Fatalf("caller's missing table: %v, want the driver's error, not ErrNotMigrated", err)
	}
}

// testBefore00009: on a database migrated before 00009 (without
// fencekit_guard_judge), Guard fails with ErrNotMigrated naming the
// migration, and changes nothing, while InTx and Once, whose guard
// (fencekit_guard_admit) predates it, keep working.
func testBefore00009(t *testing.T, d Driver) {
	e := setup(t, d)
	e.raise(fenceOf("r", 1, "h"))
	e.exec(`DROP FUNCTION IF EXISTS fencekit_guard_judge(text, bigint, text)`)
	tx := e.begin(sql.LevelDefault)
	defer func() { _ = tx.Rollback() }()
	err := pgsql.Guard(e.ctx, tx, fenceOf("r", 3, "h"))
	if !errors.Is(err, pgsql.ErrNotMigrated) || !strings.Contains(err.Error(), "migration 00009") {
		t.Fatalf("Guard without fencekit_guard_judge = %v, want ErrNotMigrated naming migration 00009", err)
	}
	_ = tx.Rollback()
	if got := e.mark("r"); got.Token != 1 {
		t.Fatalf("mark = %v, want token 1 as before", got)
	}
	ran := false
	if err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 2, "h"), func(context.Context, *sql.Tx) error {
		ran = true
		return nil
	}); err != nil || !ran {
		t.Fatalf("InTx without fencekit_guard_judge = %v (ran %v), want it admitted", err, ran)
	}
	ran = false
	if _, err := pgsql.Once(e.ctx, e.db, fenceOf("r", 4, "h"), "k", func(context.Context, *sql.Tx) error {
		ran = true
		return nil
	}); err != nil || !ran {
		t.Fatalf("Once without fencekit_guard_judge = %v (ran %v), want it admitted and run", err, ran)
	}
	if got := e.mark("r"); got.Token != 4 {
		t.Fatalf("mark = %v, want token 4", got)
	}
}
