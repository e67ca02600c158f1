package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// closedWithin reports whether ch closes within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	if d == 0 {
		return false
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// With AutoRenew a 1s lease stays held through 3s of work, and nobody
// else can take it meanwhile.
func TestAutoRenewHoldsThroughWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	// Long enough that renewals keep up on a loaded machine, short enough
	// that the work outlasts it three times.
	const ttl = time.Second
	lease, err := l.TryAcquire(ctx, "renewed", ttl, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	work := time.NewTimer(3 * time.Second)
	defer work.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	attempts := 0
	for held := true; held; {
		select {
		case <-work.C:
			held = false
		case <-lease.Done():
			t.Fatalf("lease ended during the work: %v", lease.Err())
		case <-tick.C:
			attempts++
			if got, err := l.TryAcquire(ctx, "renewed", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("another holder's TryAcquire = %v, %v during a renewed lease (validity %v, Err %v)",
					got != nil, err, lease.Validity(), lease.Err())
			}
		}
	}
	if attempts < 10 {
		t.Fatalf("only %d attempts to take the lock", attempts)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err = %v while held", err)
	}
	if d, err := lease.TTL(ctx); err != nil || d <= 0 {
		t.Fatalf("TTL = %v, %v after 3s of a %v lease", d, err, ttl)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(lease.Done(), 0) {
		t.Fatal("Done open after Release")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) || !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("Err after Release = %v, want ErrNotHeld and ErrReleased", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
}

// Deleting the key behind a renewed lease ends it at the next renewal: Done
// closes and Err matches ErrNotHeld, and Do cancels fn's context with that
// error as the cause.
func TestRenewalRefusedEndsLease(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	const ttl = 300 * time.Millisecond
	period := ttl / 3
	// Generous: one renewal period plus scheduling on a loaded machine.
	within := period + 2*time.Second

	t.Run("lease", func(t *testing.T) {
		lease, err := l.TryAcquire(ctx, "cut-lease", ttl, lock.AutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Del(ctx, keysOf(l).LockKey("cut-lease")).Err(); err != nil {
			t.Fatal(err)
		}
		if !closedWithin(lease.Done(), within) {
			t.Fatalf("Done still open %v after the key was deleted", within)
		}
		if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrReleased) {
			t.Fatalf("Err = %v, want ErrNotHeld and not ErrReleased", err)
		}
		if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("Release of a lost lease = %v, want ErrNotHeld", err)
		}
	})
	t.Run("Do", func(t *testing.T) {
		var cause error
		err := l.Do(ctx, "cut-do", ttl, func(ctx context.Context, f fence.Fence) error {
			if err := c.Del(ctx, keysOf(l).LockKey("cut-do")).Err(); err != nil {
				return err
			}
			if !closedWithin(ctx.Done(), within) {
				t.Errorf("fn's context still open %v after the key was deleted", within)
				return nil
			}
			cause = context.Cause(ctx)
			return ctx.Err()
		})
		if !errors.Is(cause, lock.ErrNotHeld) {
			t.Fatalf("cause = %v, want ErrNotHeld", cause)
		}
		if !errors.Is(err, lock.ErrNotHeld) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want fn's error joined to ErrNotHeld", err)
		}
	})
}

// When Redis becomes unreachable (the network stops carrying traffic), a
// renewed lease ends once its last successful renewal runs out: Done closes
// and Do's fn context is cancelled, although no renewal call has returned.
func TestRenewalUnreachableEndsLease(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	// The lease runs out at most one renewal period after the cut; allow
	// that plus scheduling on a loaded machine.
	within := ttl + 2*time.Second

	newClient := func(t *testing.T) (*redis.Client, *testenv.Proxy) {
		proxy := testenv.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 5 * time.Second, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c, proxy
	}

	t.Run("lease", func(t *testing.T) {
		c, proxy := newClient(t)
		l := newLocker(t, c)
		t.Cleanup(l.Close)
		lease, err := l.TryAcquire(ctx, "blackhole", ttl, lock.AutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		proxy.Block()
		cut := time.Now()
		if !closedWithin(lease.Done(), within) {
			t.Fatalf("Done still open %v after Redis became unreachable", within)
		}
		t.Logf("Done closed %v after the cut", time.Since(cut))
		if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("Err = %v, want ErrNotHeld", err)
		}
		proxy.Unblock()
	})
	t.Run("Do", func(t *testing.T) {
		c, proxy := newClient(t)
		l := newLocker(t, c)
		t.Cleanup(l.Close)
		var cause error
		err := l.Do(ctx, "blackhole-do", ttl, func(ctx context.Context, f fence.Fence) error {
			proxy.Block()
			if !closedWithin(ctx.Done(), within) {
				t.Errorf("fn's context still open %v after Redis became unreachable", within)
			}
			cause = context.Cause(ctx)
			proxy.Unblock()
			return nil
		})
		if !errors.Is(cause, lock.ErrNotHeld) {
			t.Fatalf("cause = %v, want ErrNotHeld", cause)
		}
		if !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("Do = %v, want ErrNotHeld", err)
		}
	})
}

// Extend and TTL that find the lease gone end it: Done closes.
func TestExtendOrTTLNotHeldEndsLease(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	for _, call := range []struct {
		name string
		run  func(*lock.Lease) error
	}{
		{"Extend", func(s *lock.Lease) error { return s.Extend(ctx, time.Second) }},
		{"TTL", func(s *lock.Lease) error { _, err := s.TTL(ctx); return err }},
	} {
		lease := mustAcquire(t, l, "gone-"+call.name, 10*time.Second)
		if closedWithin(lease.Done(), 0) || lease.Err() != nil {
			t.Fatalf("%s: lease ended before anything happened: %v", call.name, lease.Err())
		}
		if err := c.Del(ctx, keysOf(l).LockKey("gone-"+call.name)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := call.run(lease); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("%s = %v, want ErrNotHeld", call.name, err)
		}
		if !closedWithin(lease.Done(), 0) || !errors.Is(lease.Err(), lock.ErrNotHeld) {
			t.Fatalf("%s: Done open or Err = %v after not held", call.name, lease.Err())
		}
	}
}

// A lease without renewal ends by the clock once its TTL has passed.
func TestLeaseEndsWhenTTLRunsOut(t *testing.T) {
	l := newLocker(t, testenv.Redis(t))
	lease := mustAcquire(t, l, "short", 100*time.Millisecond)
	if !closedWithin(lease.Done(), 5*time.Second) {
		t.Fatal("Done still open 5s after a 100ms lease")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Err = %v, want ErrNotHeld", err)
	}
}

// Err alone, without anyone watching Done, reports a lease whose TTL has
// run out on the local clock.
func TestErrReportsTTLRunOut(t *testing.T) {
	l := newLocker(t, testenv.Redis(t))
	const ttl = 50 * time.Millisecond
	start := time.Now()
	lease := mustAcquire(t, l, "short-err", ttl)
	if err := lease.Err(); err != nil && time.Since(start) < ttl {
		// (A loaded machine may take the whole lease to get here.)
		t.Fatalf("Err = %v right after the grant", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lease.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Err still nil 5s after a 50ms lease")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrReleased) {
		t.Fatalf("Err = %v, want ErrNotHeld and not ErrReleased", err)
	}
	if !closedWithin(lease.Done(), 0) {
		t.Fatal("Done open after Err reported the lease lost")
	}
}

// A panic in Do's fn releases the lease and stops its renewal, then goes on
// with its original value.
func TestDoPanicReleases(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	type boom struct{ n int }
	func() {
		defer func() {
			if r := recover(); r != (boom{7}) {
				t.Fatalf("recovered %v, want the original panic value", r)
			}
		}()
		_ = l.Do(ctx, "panics", 10*time.Second, func(ctx context.Context, f fence.Fence) error {
			panic(boom{7})
		})
		t.Fatal("Do returned although fn panicked")
	}()
	if n, err := c.Exists(ctx, keysOf(l).LockKey("panics")).Result(); err != nil || n != 0 {
		t.Fatalf("lock key exists (%d, %v) after fn panicked", n, err)
	}
	lease, err := l.TryAcquire(ctx, "panics", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after a panic in Do: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A ttl with a fraction of a millisecond is counted as Redis keeps it, in
// whole milliseconds: Validity never reports time left once Redis has let
// the key go, for a grant and for an extension alike.
func TestValidityCountsWholeMilliseconds(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	const ttl = 3990 * time.Microsecond
	overstated := 0
	check := func(lease *lock.Lease) {
		t.Helper()
		key := keysOf(l).LockKey(lease.Fence().Resource)
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			n, err := c.Exists(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				// Asked after Redis answered that the key is gone.
				if v := lease.Validity(); v > 0 {
					overstated++
					t.Logf("validity %v after Redis dropped the key", v)
				}
				return
			}
		}
		t.Fatal("the key did not expire within 1s")
	}
	for i := range 60 {
		resource := fmt.Sprintf("frac-%d", i)
		lease, err := l.TryAcquire(ctx, resource, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if err := lease.Extend(ctx, ttl); errors.Is(err, lock.ErrNotHeld) {
				continue // a slow machine: the lease ran out first
			} else if err != nil {
				t.Fatal(err)
			}
		}
		check(lease)
	}
	if overstated > 0 {
		t.Fatalf("%d of 60 leases reported validity after Redis dropped their key", overstated)
	}
}

// Release with a context that has already ended (defer lease.Release(reqCtx)
// after the request ended) still stops renewal and ends the lease at once,
// and the lock is released in the background.
func TestReleaseWithEndedContext(t *testing.T) {
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	for _, owner := range []bool{false, true} {
		var opts []lock.AcquireOption
		if owner {
			opts = append(opts, lock.Owner("job"))
		}
		lease, err := l.TryAcquire(context.Background(), "ended", 300*time.Millisecond, append(opts, lock.AutoRenew())...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err = lease.Release(ctx)
		t.Logf("owner %v: Release with an ended context returned after %v: %v", owner, time.Since(start), err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Release = %v, want context.Canceled", err)
		}
		if !closedWithin(lease.Done(), 0) || !errors.Is(lease.Err(), lock.ErrReleased) {
			t.Fatalf("after Release: Done not closed or Err %v, want ErrReleased", lease.Err())
		}
		eventually(t, "the lock is still held after Release with an ended context", keyGone(c, keysOf(l).LockKey("ended")))
	}
}
