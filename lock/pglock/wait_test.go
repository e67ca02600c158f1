package pglock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/lock"
)

// queued counts resource's queue entries.
func queued(t *testing.T, pool *pgxpool.Pool, resource string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM fencekit_lock_waiter WHERE resource = $1`, resource).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// within polls cond every 10ms until it holds or d has passed.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expiry is when resource's current lease ends, on the server's clock
// read back as a time.
func expiry(t *testing.T, pool *pgxpool.Pool, resource string) time.Time {
	t.Helper()
	var end time.Time
	if err := pool.QueryRow(context.Background(), `SELECT expires_at FROM fencekit_lock WHERE resource = $1`, resource).Scan(&end); err != nil {
		t.Fatal(err)
	}
	return end
}

// TestWaitersInArrivalOrder: waiters of several Lockers (processes) are
// granted the lock in the order they queued, each by the release of the
// one before.
func TestWaitersInArrivalOrder(t *testing.T) {
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := newLocker(t, pool).TryAcquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		l := newLocker(t, pool)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := l.Acquire(ctx, "r", time.Minute)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := ls.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// The next waiter comes once this one has queued.
		within(t, 10*time.Second, "waiter queued", func() bool { return queued(t, pool, "r") == i+1 })
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(order) != n {
		t.Fatalf("%d of %d waiters granted", len(order), n)
	}
	for i, w := range order {
		if w != i {
			t.Fatalf("grant order %v, want arrival order", order)
		}
	}
}

// TestWaiterThatGivesUpLeaves: a waiter whose context ends leaves the
// queue at once, and the waiter behind it has the lock when the lease
// ends, not a refresh later.
func TestWaiterThatGivesUpLeaves(t *testing.T) {
	pool := migrated(t)
	l := newLocker(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := l.TryAcquire(ctx, "r", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	quit, giveUp := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := newLocker(t, pool).Acquire(quit, "r", time.Second); gaveUp <- err }()
	within(t, 10*time.Second, "first waiter queued", func() bool { return queued(t, pool, "r") == 1 })
	second := make(chan time.Time, 1)
	go func() {
		ls, err := newLocker(t, pool).Acquire(ctx, "r", time.Second)
		if err != nil {
			t.Error(err)
		} else {
			_ = ls.Release(ctx)
		}
		second <- time.Now()
	}()
	within(t, 10*time.Second, "second waiter queued", func() bool { return queued(t, pool, "r") == 2 })
	giveUp()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v, want context.Canceled", err)
	}
	within(t, 5*time.Second, "entry gone", func() bool { return queued(t, pool, "r") <= 1 })
	end := expiry(t, pool, "r")
	got := <-second
	// Generous for a loaded machine, below the refresh (1s) that a waiter
	// not told it is first would wait for.
	if late := got.Sub(end); late > 900*time.Millisecond {
		t.Fatalf("the second waiter had the lock %v after the lease's end", late)
	}
	t.Logf("second waiter granted %v after the lease's end", got.Sub(end))
}

// TestVanishedWaiterCostsItsLease: a waiter that queued and vanished (its
// process stopped: it neither refreshes nor takes its grant) is handed the
// lock by the release; the live waiter behind it has the lock once that
// lease ends.
func TestVanishedWaiterCostsItsLease(t *testing.T) {
	pool := migrated(t)
	l := newLocker(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := l.TryAcquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The vanished waiter: queued by the statement its process sent, then
	// nothing more.
	if _, err := pool.Exec(ctx, `SELECT fencekit_lock_acquire('r', 'gone', 300, 60000, 3000, true)`); err != nil {
		t.Fatal(err)
	}
	live := make(chan time.Time, 1)
	go func() {
		ls, err := newLocker(t, pool).Acquire(ctx, "r", time.Second)
		if err != nil {
			t.Error(err)
			live <- time.Time{}
			return
		}
		live <- time.Now()
		_ = ls.Release(ctx)
	}()
	within(t, 10*time.Second, "live waiter queued", func() bool { return queued(t, pool, "r") == 2 })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var goneUntil time.Time
	if err := pool.QueryRow(ctx, `SELECT expires_at FROM fencekit_lock WHERE resource = 'r' AND holder = 'gone'`).Scan(&goneUntil); err != nil {
		t.Fatalf("the lock was not handed to the vanished waiter first: %v", err)
	}
	got := <-live
	if got.IsZero() {
		return
	}
	if got.Before(goneUntil.Add(-50 * time.Millisecond)) {
		t.Fatalf("the live waiter had the lock at %v, before the vanished one's lease ended at %v", got, goneUntil)
	}
	if late := got.Sub(goneUntil); late > 900*time.Millisecond {
		t.Fatalf("the live waiter had the lock %v after the vanished one's lease ended", late)
	}
	t.Logf("live waiter granted %v after the vanished waiter's 300ms lease", got.Sub(goneUntil))
}

// TestPollingWithoutListen: a Locker told to poll (lock.WithWait, as
// behind PgBouncer in transaction mode, where LISTEN cannot work) opens no
// LISTEN connection and still gets the lock once it is released.
func TestPollingWithoutListen(t *testing.T) {
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := newLocker(t, pool).TryAcquire(ctx, "r", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	poller := newLocker(t, pool, lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
	got := make(chan error, 1)
	go func() {
		ls, err := poller.Acquire(ctx, "r", time.Second)
		if err == nil {
			_ = ls.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the polling waiter never had the lock")
	}
}

// acquireCounter counts the grant statements a pool sends.
type acquireCounter struct{ n atomic.Int64 }

func (c *acquireCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	// The grant statement (the full path's function in it), or the
	// older one on a schema before migration 00008.
	if strings.Contains(d.SQL, "fencekit_lock_grant(") || strings.Contains(d.SQL, "fencekit_lock_acquire(") {
		c.n.Add(1)
	}
	return ctx
}

func (c *acquireCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestReleaseWakesWaiterByNotification: the waiter has the lock from the
// release's NOTIFY, which carries its grant: it sends no statement between
// the release and holding the lock (no poll found it), and has it well
// before the next refresh.
func TestReleaseWakesWaiterByNotification(t *testing.T) {
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := pool.Config()
	counter := &acquireCounter{}
	cfg.ConnConfig.Tracer = counter
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer wpool.Close()
	first, err := newLocker(t, pool).TryAcquire(ctx, "r", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		ls, err := newLocker(t, wpool).Acquire(ctx, "r", time.Second)
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		_ = ls.Release(ctx)
	}()
	within(t, 10*time.Second, "waiter queued", func() bool { return queued(t, pool, "r") == 1 })
	before := counter.n.Load()
	released := time.Now()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	at := <-got
	if at.IsZero() {
		return
	}
	after := counter.n.Load()
	t.Logf("the waiter had the lock %v after the release; grant statements: %d before, %d after", at.Sub(released), before, after)
	if after != before {
		t.Fatalf("the waiter sent %d grant statements after the release: it found the lock by trying, not by the notification", after-before)
	}
}
