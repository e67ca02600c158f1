package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestTokensIncrease: 50 grants of one resource from two Lockers carry
// strictly increasing tokens in the clock-anchored space, and so do the
// grants after the lock's rows were deleted (as a restore of an older
// backup would leave them).
func TestTokensIncrease(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 60*time.Second)
	ls := []*lock.Locker{newLocker(t, db), newLocker(t, db)}
	var last fence.Token
	floor := fence.Token(serverMicros(t, db))
	for i := range 50 {
		lease, err := ls[i%2].TryAcquire(ctx, "tokens", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tok := lease.Fence().Token
		if tok <= last || tok < floor || tok > fence.MaxToken {
			t.Fatalf("grant %d: token %d after %d (clock floor %d)", i, tok, last, floor)
		}
		last = tok
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 24 {
			if _, err := db.ExecContext(ctx, `DELETE FROM fencekit_lock`); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestTokensAfterRestore: after the lock's table is put back to an older
// state (a restore of an older backup: an older counter, the old holder's
// lease), the next grant's token is still above every token issued, and
// the restored lease ends by its expiry on the server's clock.
func TestTokensAfterRestore(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 30*time.Second)
	l := newLocker(t, db)
	first, err := l.TryAcquire(ctx, "restored", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE backup AS SELECT * FROM fencekit_lock`); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := first.Fence().Token
	for range 10 {
		ls, err := l.TryAcquire(ctx, "restored", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, ls.Fence().Token)
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{`DELETE FROM fencekit_lock`, `INSERT INTO fencekit_lock SELECT * FROM backup`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var ls *lock.Lease
	waitFor(t, func() bool {
		ls, err = l.TryAcquire(ctx, "restored", time.Second)
		return err == nil
	})
	t.Logf("first %d last %d after %d", first.Fence().Token, last, ls.Fence().Token)
	if ls.Fence().Token <= last {
		t.Fatalf("token %d after the restore, not above %d issued before", ls.Fence().Token, last)
	}
	_ = ls.Release(ctx)
}

// TestLeaseOnServerClock: the server ends a lease at its TTL on its own
// clock: another Locker is refused before, granted after, and the first
// holder's Extend and Release then answer ErrNotHeld.
func TestLeaseOnServerClock(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 60*time.Second)
	a, b := newLocker(t, db), newLocker(t, db)
	la, err := a.TryAcquire(ctx, "lease", 700*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var na *lock.NotAcquiredError
	if _, err := b.TryAcquire(ctx, "lease", time.Second); !errors.As(err, &na) || na.Remaining <= 0 || na.Remaining > 700*time.Millisecond {
		t.Fatalf("TryAcquire of a held lock = %v, want NotAcquiredError with what is left", err)
	}
	if ttl, err := la.TTL(ctx); err != nil || ttl <= 0 || ttl > 700*time.Millisecond {
		t.Fatalf("TTL = %v, %v", ttl, err)
	}
	// The server's row says when the lease ends; wait past it on its clock.
	var end int64
	if err := db.QueryRowContext(ctx, `SELECT expires_us FROM fencekit_lock WHERE resource = 'lease'`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	for serverMicros(t, db) <= end {
		time.Sleep(50 * time.Millisecond)
	}
	lb, err := b.TryAcquire(ctx, "lease", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the lease ended on the server's clock: %v", err)
	}
	if lb.Fence().Token <= la.Fence().Token {
		t.Fatalf("token %d after %d", lb.Fence().Token, la.Fence().Token)
	}
	if _, err := la.TTL(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("TTL of the ended lease = %v, want ErrNotHeld", err)
	}
	if err := la.Extend(ctx, time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Extend of the ended lease = %v, want ErrNotHeld", err)
	}
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the ended lease = %v, want ErrNotHeld", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireArrivalOrder: waiters from several Lockers, queued one after
// another, are handed the lock in arrival order, each woken by the
// release before it (well before the lease would end).
func TestAcquireArrivalOrder(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 90*time.Second)
	holder := newLocker(t, db)
	first, err := holder.TryAcquire(ctx, "queue", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	release := make([]chan struct{}, n)
	for i := range n {
		release[i] = make(chan struct{})
		l := newLocker(t, db)
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, "queue", 30*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			<-release[i]
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		// Wait until waiter i is queued before the next one arrives.
		waitFor(t, func() bool {
			var c int
			_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM fencekit_lock_waiter WHERE resource = 'queue'`).Scan(&c)
			return c == i+1
		})
	}
	start := time.Now()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		waitFor(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == i+1
		})
		close(release[i])
	}
	wg.Wait()
	for i, w := range order {
		if w != i {
			t.Fatalf("granted in order %v, want arrival order", order)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("%d hand-overs took %v: not woken by the releases", n, d)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBadInputWritesNothing: invalid arguments are refused with
// fence.ErrInvalid and nothing is written.
func TestBadInputWritesNothing(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 30*time.Second)
	l := newLocker(t, db)
	for _, c := range []struct {
		name     string
		resource string
		ttl      time.Duration
	}{
		{"empty resource", "", time.Second},
		{"too long", strings.Repeat("x", fence.MaxResourceLen+1), time.Second},
		{"not UTF-8", "a\xffb", time.Second},
		{"NUL", "a\x00b", time.Second},
		{"zero TTL", "r", 0},
		{"short TTL", "r", time.Microsecond},
		{"long TTL", "r", lock.MaxTTL + time.Second},
	} {
		if _, err := l.TryAcquire(ctx, c.resource, c.ttl); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: TryAcquire = %v, want fence.ErrInvalid", c.name, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil) = %v, want fence.ErrInvalid", err)
	}
	one := migrated(t)
	one.SetMaxOpenConns(1)
	if _, err := New(one); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New on a *sql.DB of one connection = %v, want fence.ErrInvalid", err)
	}
	if _, err := New(db, lock.WithPrefix("x:")); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New with a prefix = %v, want fence.ErrInvalid", err)
	}
	if _, err := l.TryAcquire(ctx, "r", time.Second, lock.Owner("worker-1")); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("TryAcquire with an Owner = %v, want fence.ErrInvalid", err)
	}
	if _, err := l.FenceLock(ctx, "some:lock", "value"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("FenceLock = %v, want fence.ErrInvalid", err)
	}
	if _, err := New(db, lock.WithPrefix("x:")); !errors.Is(err, lock.ErrUnsupported) {
		t.Errorf("New with a prefix = %v, want lock.ErrUnsupported", err)
	}
	if _, err := l.TryAcquire(ctx, "r", time.Second, lock.Owner("worker-1")); !errors.Is(err, lock.ErrUnsupported) {
		t.Errorf("TryAcquire with an Owner = %v, want lock.ErrUnsupported", err)
	}
	var names lock.RedisNames
	if l.As(&names) {
		t.Error("As(*RedisNames) = true on a MySQL Locker, want false")
	}
	var rows, waiters int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM fencekit_lock), (SELECT COUNT(*) FROM fencekit_lock_waiter)`).Scan(&rows, &waiters); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || waiters != 0 {
		t.Fatalf("bad input wrote %d lock rows and %d queue entries", rows, waiters)
	}
}

// TestNotMigratedNamesCall: on a database without the lock's schema, each
// call's error matches ErrNotMigrated and names the call and resource.
func TestNotMigratedNamesCall(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := ctxFor(t, 30*time.Second)
	l := newLocker(t, db)
	_, err := l.TryAcquire(ctx, "unmigrated", time.Second)
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), `"unmigrated"`) || !strings.Contains(err.Error(), "UpMySQL") {
		t.Fatalf("TryAcquire on an unmigrated database = %v, want ErrNotMigrated naming the call", err)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := l.Acquire(actx, "unmigrated", time.Second); !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("Acquire on an unmigrated database = %v, want ErrNotMigrated", err)
	}
}

// TestCancelledLeavesNothing: a call whose context has ended returns
// ctx.Err() and leaves no lock behind.
func TestCancelledLeavesNothing(t *testing.T) {
	db := migrated(t)
	l := newLocker(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.TryAcquire(ctx, "cancelled", time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with an ended context = %v", err)
	}
	lease, err := newLocker(t, db).TryAcquire(ctxFor(t, 10*time.Second), "cancelled", time.Second)
	if err != nil {
		t.Fatalf("the resource is not free after a cancelled call: %v", err)
	}
	_ = lease.Release(context.Background())
}

// TestTokensExhausted: a grant whose token would pass 2^53-1 is refused
// with ErrTokensExhausted, on the fast path and in the procedure, and the
// lock stays free; Advance raises the counter and never lowers it.
func TestTokensExhausted(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 30*time.Second)
	l := newLocker(t, db)
	if err := l.Advance(ctx, "r", fence.MaxToken-1); err != nil {
		t.Fatal(err)
	}
	if err := l.Advance(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, "r", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Fence().Token != fence.MaxToken {
		t.Fatalf("token %d after Advance to MaxToken-1, want %d", lease.Fence().Token, fence.MaxToken)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fast", "procedure"} {
		if name == "procedure" {
			// A queue entry sends the grant to the procedure.
			if _, err := db.ExecContext(ctx, `UPDATE fencekit_lock SET waiting = TRUE WHERE resource = 'r'`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.TryAcquire(ctx, "r", time.Second); !errors.Is(err, lock.ErrTokensExhausted) {
			t.Fatalf("%s: grant past 2^53-1 = %v, want ErrTokensExhausted", name, err)
		}
		var holder sql.NullString
		if err := db.QueryRowContext(ctx, `SELECT holder FROM fencekit_lock WHERE resource = 'r'`).Scan(&holder); err != nil || holder.Valid {
			t.Fatalf("%s: after the refusal the lock is held by %v (%v), want free", name, holder, err)
		}
	}
}

// TestIdleRowsReclaimed: a Locker deletes the rows of resources idle past
// their retention by itself, and tokens keep increasing after.
func TestIdleRowsReclaimed(t *testing.T) {
	t.Parallel()
	db := migrated(t)
	l := newLocker(t, db, lock.WithTokenRetention(time.Millisecond))
	ctx := ctxFor(t, 60*time.Second)
	var last fence.Token
	for i := range 2 {
		ls, err := l.TryAcquire(ctx, "idle", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ls.Fence().Token <= last {
			t.Fatalf("grant %d: token %d not above %d", i, ls.Fence().Token, last)
		}
		last = ls.Fence().Token
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			var n int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM fencekit_lock`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
	}
}
