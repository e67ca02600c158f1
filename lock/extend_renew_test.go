package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/lock"
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
		pttl, err := c.PTTL(ctx, l.LockKey("extended")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v := lease.Validity(); v > pttl+5*time.Millisecond {
			t.Fatalf("Validity %v, but Redis holds the lock for %v", v, pttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pttl, err := c.PTTL(ctx, l.LockKey("extended")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl < time.Second {
		t.Fatalf("3.2 s after Extend(3s) with renewal on, Redis holds the lock for %v: renewal cut it back to the grant's ttl", pttl)
	}
}
