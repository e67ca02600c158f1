package lock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// TestRenewalKeepsTheTTLOfTheLastExtend: after Extend to a longer ttl,
// renewal keeps the lock at that ttl instead of cutting it back to the
// grant's, and Validity never exceeds what Redis holds.
func TestRenewalKeepsTheTTLOfTheLastExtend(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	lease, err := l.TryAcquire(ctx, "extended", 300*time.Millisecond, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if err := lease.Extend(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	// Renewal comes when two thirds of the ttl are left: about 1 s in with
	// the extended ttl, at about 2.8 s with the grant's. By 3.2 s a renewal
	// that went back to the grant's 300 ms would leave at most 300 ms.
	deadline := time.Now().Add(3200 * time.Millisecond)
	for time.Now().Before(deadline) {
		var pttl time.Duration
		var err error
		// Validity read after PTTL can only be smaller, unless a renewal
		// landed between the two reads: then the sample says nothing.
		before := lease.Validity()
		pttl, err = c.PTTL(ctx, keysOf(l).LockKey("extended")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v := lease.Validity(); v <= before && v > pttl+5*time.Millisecond {
			t.Fatalf("Validity %v, but Redis holds the lock for %v", v, pttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pttl, err := c.PTTL(ctx, keysOf(l).LockKey("extended")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl < time.Second {
		t.Fatalf("3.2 s after Extend(3s) with renewal on, Redis holds the lock for %v: renewal cut it back to the grant's ttl", pttl)
	}
}

// lateExtension replays an extension that its caller gave up on and that
// reaches Redis only after a later one: the script as the lease sends it,
// with the earlier, shorter ttl.
func lateExtension(t *testing.T, c redis.Scripter, l *lock.Locker, resource, holder string, ttl time.Duration) {
	t.Helper()
	src, err := os.ReadFile("internal/redisbackend/extend.lua")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{keysOf(l).LockKey(resource), keysOf(l).TokenKey(resource)}
	if err := redis.NewScript(string(src)).Run(context.Background(), c, keys, holder, ttl.Milliseconds(), int64(time.Minute/time.Millisecond)).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestLateExtensionNeverShortens replays what the Redlock model found: a
// renewal to the grant's short ttl, given up by its caller while a node
// was slow, reached that node after the user's Extend to a longer ttl and
// cut the lock back, so a quorum let the lease go while it was still
// told it had more than 100ms. An extension now only lengthens a lock.
// Replay the model's run with FENCEKIT_CHECK_SEED=1795460282017370007
// FENCEKIT_CHECK_TIME=60s go test -run '^TestLockModelRedlock$' ./lock.
func TestLateExtensionNeverShortens(t *testing.T) {
	ctx := context.Background()
	t.Run("single node", func(t *testing.T) {
		c := testenv.Redis(t)
		l := newLocker(t, c)
		t.Cleanup(l.Close)
		lease, err := l.TryAcquire(ctx, "late-extension", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		if err := lease.Extend(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		lateExtension(t, c, l, "late-extension", lease.Fence().Holder, 2*time.Second)
		pttl, err := c.PTTL(ctx, keysOf(l).LockKey("late-extension")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v := lease.Validity(); pttl+time.Millisecond < v || pttl < 19*time.Second {
			t.Fatalf("after Extend(20s) and a late extension to 2s, Redis holds the lock for %v; the lease is told %v", pttl, v)
		}
		// A shorter Extend of its own does not cut the lock either, and
		// the lease counts what the lock has.
		if err := lease.Extend(ctx, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		pttl, err = c.PTTL(ctx, keysOf(l).LockKey("late-extension")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v := lease.Validity(); pttl < 19*time.Second || v < 19*time.Second || v > pttl+time.Millisecond {
			t.Fatalf("after Extend(200ms) of a lock with %v left, the lease is told %v", pttl, v)
		}
	})
	t.Run("redlock", func(t *testing.T) {
		ns := startNodes(t, 3, 0)
		l := newRedlock(t, ns)
		lease, err := l.TryAcquire(ctx, "late-extension", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		if err := lease.Extend(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, c := range ns.direct {
			lateExtension(t, c, l, "late-extension", lease.Fence().Holder, 2*time.Second)
		}
		v := lease.Validity()
		for i, c := range ns.direct {
			pttl, err := c.PTTL(ctx, keysOf(l).LockKey("late-extension")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if pttl+time.Millisecond < v || pttl < 19*time.Second {
				t.Errorf("node %d holds the lock for %v after a late extension to 2s; the lease is told %v", i, pttl, v)
			}
		}
	})
}
