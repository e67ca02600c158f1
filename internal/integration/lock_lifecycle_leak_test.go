package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestLockLifecycleLeavesNoGoroutines drives every goroutine the lock
// starts (the shared subscription's reader and writer, renewals, Do's
// renewal when fn panics, a renewal that ends by loss) and checks that
// once the Locker is closed none is left, even for a lease still held.
func TestLockLifecycleLeavesNoGoroutines(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	if err := c.Ping(ctx).Err(); err != nil { // the client's own connections come first
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	l := newLocker(t, c)

	// Waiters on a held resource share a subscription.
	holder, err := l.TryAcquire(ctx, "leak-wait", 30*time.Second, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
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
	waitSubscriber(t, c, keysOf(l).ReleaseChannel("leak-wait"))
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	// A renewal that ends because the lease was lost.
	lost, err := l.TryAcquire(ctx, "leak-lost", 300*time.Millisecond, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, keysOf(l).LockKey("leak-lost")).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lost lease's Done still open after 10s")
	}

	// Do whose fn panics.
	func() {
		defer func() { _ = recover() }()
		_ = l.Do(ctx, "leak-panic", 5*time.Second, func(context.Context, fence.Fence) error { panic("boom") })
	}()

	// A renewed lease still held when the Locker closes: Close stops its
	// renewal.
	open, err := l.TryAcquire(ctx, "leak-open", 5*time.Second, lock.AutoRenew(), lock.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	// Checked while the client is still open: closing it would end the
	// subscription's goroutines whether or not Close did.
	goleak.VerifyNone(t, before)
	if err := open.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// waitSubscriber polls until channel has a subscriber.
func waitSubscriber(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := c.PubSubNumSub(context.Background(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[channel] > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no subscriber on %s within 10s", channel)
}
