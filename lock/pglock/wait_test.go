package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// TestWaitersInArrivalOrder: waiters from several backends (processes)
// are granted the lock in the order they queued, each by the release of
// the one before.
func TestWaitersInArrivalOrder(t *testing.T) {
	pool := migratedPool(t)
	holderB := testBackend(t, pool, config{})
	ctx := ctxFor(t, 60*time.Second)
	if _, err := holderB.tryAcquire(ctx, "r", "h0", time.Minute); err != nil {
		t.Fatal(err)
	}
	const n = 5
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		b := testBackend(t, pool, config{}) // one per waiter: as many processes
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("w%d", i)
			g, err := b.acquire(ctx, "r", holder, time.Minute)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if held, err := b.release(ctx, "r", holder); err != nil || !held {
				t.Errorf("waiter %d release (token %d): %v, %v", i, g.token, held, err)
			}
		}()
		// The next waiter comes once this one has queued.
		eventually(t, 10*time.Second, "waiter queued", func() bool { return waiters(t, pool, "r") == i+1 })
	}
	if _, err := holderB.release(ctx, "r", "h0"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, w := range order {
		if w != i {
			t.Fatalf("grant order %v, want arrival order", order)
		}
	}
	if len(order) != n {
		t.Fatalf("%d of %d waiters granted", len(order), n)
	}
}

// TestReleaseWakesWaiterByNotification: with refreshes and lease-end tries
// far away (an hour), only the release's notification can wake the waiter;
// it holds the lock when it returns. The control without a listener polls.
func TestReleaseWakesWaiterByNotification(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 60*time.Second)
	if _, err := b.tryAcquire(ctx, "r", "h0", time.Hour); err != nil {
		t.Fatal(err)
	}
	w := testBackend(t, pool, config{refresh: time.Hour})
	tries := 0
	w.onTry = func() { tries++ }
	got := make(chan error, 1)
	go func() {
		_, err := w.acquire(ctx, "r", "w1", time.Minute)
		got <- err
	}()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return waiters(t, pool, "r") == 1 })
	released := time.Now()
	if _, err := b.release(ctx, "r", "h0"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
	t.Logf("woken %v after the release, %d tries", time.Since(released), tries)
	// Two tries: the one that queued, the one the notification woke.
	if tries != 2 {
		t.Fatalf("%d tries, want 2 (queue, then woken)", tries)
	}
	if _, err := w.release(ctx, "r", "w1"); err != nil {
		t.Fatal(err)
	}
}

// TestWaiterThatGivesUpLeaves: a waiter whose context ends leaves the
// queue at once, and the waiter behind it is told it is first.
func TestWaiterThatGivesUpLeaves(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 60*time.Second)
	if _, err := b.tryAcquire(ctx, "r", "h0", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	quit, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := b.acquire(quit, "r", "w1", time.Second); gaveUp <- err }()
	eventually(t, 10*time.Second, "first waiter queued", func() bool { return waiters(t, pool, "r") == 1 })
	second := make(chan time.Time, 1)
	go func() {
		if _, err := b.acquire(ctx, "r", "w2", time.Second); err != nil {
			t.Error(err)
		}
		second <- time.Now()
	}()
	eventually(t, 10*time.Second, "second waiter queued", func() bool { return waiters(t, pool, "r") == 2 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v, want context.Canceled", err)
	}
	eventually(t, 5*time.Second, "entry gone", func() bool { return waiters(t, pool, "r") <= 1 })
	var end time.Time
	if err := pool.QueryRow(ctx, `SELECT expires_at FROM fencekit_lock WHERE resource = 'r'`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	got := <-second
	// The second waiter tries at the lease's end: generous bound for a
	// loaded machine, far below the refresh-by-refresh cost of not knowing.
	if late := got.Sub(end); late > 900*time.Millisecond {
		t.Fatalf("the second waiter had the lock %v after the lease's end", late)
	}
	t.Logf("second waiter granted %v after the lease's end", got.Sub(end))
}

// TestVanishedWaiterCostsItsLease: a waiter that queued and vanished is
// handed the lock by the release; the live waiter behind it, told it is
// first, has the lock once the vanished one's lease ends.
func TestVanishedWaiterCostsItsLease(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 60*time.Second)
	if _, err := b.tryAcquire(ctx, "r", "h0", time.Minute); err != nil {
		t.Fatal(err)
	}
	// The vanished waiter: one try that queues it, then nothing.
	if _, r, err := b.try(ctx, "Acquire", "r", "gone", 300*time.Millisecond, queueLife, true); err != nil || r == nil || r.place != 0 {
		t.Fatalf("vanished waiter's try: %v, %v", r, err)
	}
	live := make(chan time.Time, 1)
	var liveToken fence.Token
	go func() {
		g, err := b.acquire(ctx, "r", "live", time.Second)
		if err != nil {
			t.Error(err)
			live <- time.Time{}
			return
		}
		liveToken = g.token
		live <- time.Now()
	}()
	eventually(t, 10*time.Second, "live waiter queued", func() bool { return waiters(t, pool, "r") == 2 })
	if _, err := b.release(ctx, "r", "h0"); err != nil {
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
	t.Logf("live waiter (token %d) granted %v after the vanished waiter's lease", liveToken, got.Sub(goneUntil))
}

// TestPollingWithoutListen: a backend that polls (as behind PgBouncer in
// transaction mode) still gets the lock, in a bounded time.
func TestPollingWithoutListen(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 60*time.Second)
	if _, err := b.tryAcquire(ctx, "r", "h0", time.Hour); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	tries := 0
	b.onTry = func() { tries++ }
	go func() { _, err := b.acquire(ctx, "r", "w1", time.Second); got <- err }()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return waiters(t, pool, "r") == 1 })
	time.Sleep(300 * time.Millisecond)
	if _, err := b.release(ctx, "r", "h0"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if tries < 3 {
		t.Fatalf("%d tries: the waiter did not poll", tries)
	}
}
