package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// An owner re-enters the lock it holds with the same fence and one more
// hold; the lock stays held until the last hold is released; other owners
// and owner-less callers are refused throughout.
func TestOwnerReentry(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	refused := func(when string) {
		t.Helper()
		for _, opts := range [][]lock.AcquireOption{{lock.Owner("job-2")}, nil} {
			if _, err := l.TryAcquire(ctx, "re", time.Second, opts...); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("%s: TryAcquire(%d options) = %v, want ErrNotAcquired", when, len(opts), err)
			}
		}
	}

	a, err := l.TryAcquire(ctx, "re", 10*time.Second, lock.Owner("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, "re", 10*time.Second, lock.Owner("job-1"))
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if a.Fence() != b.Fence() {
		t.Fatalf("re-entry fence %v, first %v", b.Fence(), a.Fence())
	}
	refused("two holds")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(a.Done(), 0) || closedWithin(b.Done(), 0) {
		t.Fatal("Done must close for the released hold only")
	}
	refused("one hold left")
	if err := a.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second release of one hold = %v, want ErrNotHeld", err)
	}
	refused("after releasing one hold twice")
	if err := b.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend of the remaining hold: %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, keysOf(l).LockKey("re")).Result(); err != nil || n != 0 {
		t.Fatalf("lock key exists (%d, %v) after the last hold was released", n, err)
	}
	// The next owner gets a new grant with a higher token.
	d, err := l.TryAcquire(ctx, "re", time.Second, lock.Owner("job-2"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Fence().Token <= a.Fence().Token || d.Fence().Holder == a.Fence().Holder {
		t.Fatalf("next grant %v after %v", d.Fence(), a.Fence())
	}
	// Without Owner, a holder never re-enters, not even the same owner-less
	// Locker.
	if err := d.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e := mustAcquire(t, l, "re", time.Second)
	if _, err := l.TryAcquire(ctx, "re", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("owner-less re-entry = %v, want ErrNotAcquired", err)
	}
	if _, err := l.TryAcquire(ctx, "re", time.Second, lock.Owner("job-1")); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("owner entering an owner-less lock = %v, want ErrNotAcquired", err)
	}
	if err := e.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A client retry of a re-entry (or of a hold's release) whose first run
// happened counts once: after the two holds are released the lock is free.
func TestOwnerReentryRetriedCountsOnce(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	replay := &testenv.Replay{}
	c.AddHook(replay)
	l := newLocker(t, c)
	// Load the scripts, so that each replayed command is the script itself
	// and not a NOSCRIPT refusal.
	warm, err := l.TryAcquire(ctx, "warm", time.Second, lock.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	a, err := l.TryAcquire(ctx, "retried", 10*time.Second, lock.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	replay.Arm(0)
	b, err := l.TryAcquire(ctx, "retried", 10*time.Second, lock.Owner("job"))
	if err != nil {
		t.Fatalf("replayed re-entry: %v", err)
	}
	if b.Fence() != a.Fence() {
		t.Fatalf("replayed re-entry fence %v, first %v", b.Fence(), a.Fence())
	}
	replay.Arm(0)
	if err := a.Release(ctx); err != nil {
		t.Fatalf("replayed release of a hold: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "retried", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("after one of two holds was released (its release replayed): %v, want ErrNotAcquired", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := l.TryAcquire(ctx, "retried", time.Second)
	if err != nil {
		t.Fatalf("after both holds were released: %v", err)
	}
	_ = f.Release(ctx)
}

// Holds of an owner that are renewed keep the lock; the lock is freed (and
// a waiter woken) only when the last one is released.
func TestOwnerLastReleaseWakesWaiter(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	a, err := l.TryAcquire(ctx, "wake", 30*time.Second, lock.Owner("job"), lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, "wake", 30*time.Second, lock.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "wake", time.Second)
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	waitSubscribed(t, c, keysOf(l).ReleaseChannel("wake"), 1)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		t.Fatalf("waiter got the lock while a hold remained (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken within 10s of the last hold's release (the lease had 30s)")
	}
}

func TestOwnerInvalid(t *testing.T) {
	l := newLocker(t, testenv.Redis(t))
	for _, id := range []string{"", strings.Repeat("o", lock.MaxOwnerLen+1)} {
		if _, err := l.TryAcquire(context.Background(), "r", time.Second, lock.Owner(id)); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("Owner(%d bytes) = %v, want ErrInvalid", len(id), err)
		}
	}
}

// wantRefusedWhileHeld fails t if another Locker can take resource while
// lease still reports time left, checking until lease's validity is down to
// margin or for d, whichever is first.
func wantRefusedWhileHeld(t *testing.T, other *lock.Locker, lease *lock.Lease, resource string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		v := lease.Validity()
		got, err := other.TryAcquire(ctx, resource, time.Second)
		if err == nil {
			_ = got.Release(ctx)
			t.Fatalf("another Locker took the lock (token %d) while the outer hold reported validity %v and Err %v",
				got.Fence().Token, v, lease.Err())
		}
		if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatal(err)
		}
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("outer hold lost: %v", err)
	}
}

// No hold of an owner shortens the lock below what another hold was told:
// an inner hold that extends to (and renews at) a short lease and is
// released leaves the lock held for the outer hold's lease.
func TestOwnerHoldNeverShortensAnother(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	other, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)

	t.Run("Extend", func(t *testing.T) {
		outer, err := l.TryAcquire(ctx, "ext", 5*time.Second, lock.Owner("job"), lock.AutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		inner, err := l.TryAcquire(ctx, "ext", 100*time.Millisecond, lock.Owner("job"))
		if err != nil {
			t.Fatal(err)
		}
		if err := inner.Extend(ctx, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := inner.Release(ctx); err != nil {
			t.Fatal(err)
		}
		pttl, err := c.PTTL(ctx, keysOf(l).LockKey("ext")).Result()
		if err != nil {
			t.Fatal(err)
		}
		// PTTL counts whole milliseconds of Redis's millisecond clock, so it
		// may read up to 1 ms below what the lock has; a shortened lock
		// would be short by the outer hold's seconds.
		if v := outer.Validity(); pttl+time.Millisecond < v {
			t.Fatalf("lock PTTL %v after the inner hold's Extend, below the outer hold's validity %v", pttl, v)
		}
		wantRefusedWhileHeld(t, other, outer, "ext", 600*time.Millisecond)
		if err := outer.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("nested Do", func(t *testing.T) {
		err := l.Do(ctx, "do", 5*time.Second, func(outerCtx context.Context, _ fence.Fence) error {
			// The inner hold's lease is short enough to be renewed a few
			// times while it sleeps, and long enough that a loaded machine
			// (CI saw a 90 ms lease lapse at load 30) renews it in time.
			if err := l.Do(ctx, "do", 300*time.Millisecond, func(context.Context, fence.Fence) error {
				time.Sleep(350 * time.Millisecond) // a few renewals of the inner hold
				return nil
			}, lock.Owner("job")); err != nil {
				return err
			}
			for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if got, err := other.TryAcquire(ctx, "do", time.Second); err == nil {
					_ = got.Release(ctx)
					return errors.New("another Locker took the lock while the outer Do ran")
				}
				if outerCtx.Err() != nil {
					return context.Cause(outerCtx)
				}
			}
			return nil
		}, lock.Owner("job"))
		if err != nil {
			t.Fatal(err)
		}
	})
}
