package integration_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

// TestPostgresLockerLeavesNoGoroutines drives the goroutines a Locker on
// PostgreSQL starts (its LISTEN connection, the reclaimer, waiters woken
// by NOTIFY, renewals, Do's renewal when fn panics, an election term and
// an observer) and checks that once the Locker and its pool are closed
// none is left, even for a lease still held.
func TestPostgresLockerLeavesNoGoroutines(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	l, err := pglock.New(pool)
	if err != nil {
		t.Fatal(err)
	}

	holder, err := l.TryAcquire(ctx, "leak-wait", 30*time.Second, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, "leak-wait", 5*time.Second, lock.AutoRenew())
			if err != nil {
				t.Error(err)
				return
			}
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	// The waiters queue, so that the release hands the lock over by NOTIFY.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencekit_lock_waiter WHERE resource = 'leak-wait'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 waiters queued after 10s", n)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	func() {
		defer func() { _ = recover() }()
		_ = l.Do(ctx, "leak-panic", 5*time.Second, func(context.Context, fence.Fence) error { panic("boom") })
	}()

	e, err := election.New(l, "leak-election", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	octx, stopObserving := context.WithCancel(ctx)
	observed := e.Observe(octx)
	term, err := e.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-observed:
	case <-time.After(10 * time.Second):
		t.Fatal("the observer saw no leader within 10s")
	}
	stopObserving()
	for range observed {
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	// A renewed lease still held when the Locker closes.
	if _, err := l.TryAcquire(ctx, "leak-open", 5*time.Second, lock.AutoRenew()); err != nil {
		t.Fatal(err)
	}
	l.Close()
	pool.Close()
	goleak.VerifyNone(t, before)
}
