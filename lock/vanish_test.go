package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// Waiters that leave the queue, or vanish from it, and what that costs the
// waiters behind them. The figures are logged (go test -run
// 'TestWaiterThatGivesUp|TestVanishedWaiters' -v ./lock); the bounds are
// generous for a loaded machine and far below the second that a waiter's
// refresh takes.

// leaveBound is how long after the moment the lock became free (a lease's
// end, a release) the live waiter may take to get it in these tests: what
// the vanished waiters ahead of it may cost, plus room for a loaded
// machine.
const leaveBound = 400 * time.Millisecond

// cutOff returns a Locker whose client reaches srv through a proxy the
// test can cut, with short timeouts so that its calls, once cut, fail fast.
func cutOff(t *testing.T, srv *testenv.RedisServer, prefix string) (*lock.Locker, *testenv.Proxy) {
	t.Helper()
	p := testenv.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, p
}

// vanishBound is the same for the tests in which vanished waiters were
// handed the lock for their 100ms leases: what they may cost (a lease and
// a try each), plus room for a loaded machine, and well below the second
// it took before (a refresh, then a lease).
const vanishBound = 600 * time.Millisecond

// afterRefresh returns once the waiter at rank in resource's queue has
// refreshed its entry: its next refresh is about a second away, so a waiter
// that learns what changed only from its refresh is late by that much.
func afterRefresh(t *testing.T, c redis.UniversalClient, l *lock.Locker, resource string, rank int64) {
	t.Helper()
	ctx := context.Background()
	queue, waiting := queueKeys(l, resource)
	ids := c.ZRange(ctx, queue, rank, rank).Val()
	if len(ids) != 1 {
		t.Fatalf("no waiter at rank %d: %v", rank, ids)
	}
	entry := c.HGet(ctx, waiting, ids[0]).Val()
	eventually(t, "the waiter did not refresh its entry", func() bool {
		return c.HGet(ctx, waiting, ids[0]).Val() != entry
	})
}

// TestWaiterThatGivesUpCostsNothing: the three waiters at the head of the
// queue give up (their context ends) 200ms before a lease that nobody
// releases runs out, just after the fourth refreshed its entry. The fourth,
// which only refreshes (the first three try at the lease's end), is told at
// once that it is now the head, and gets the lock when the lease ends, not
// at its next refresh a second later.
func TestWaiterThatGivesUpCostsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "givesup"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	mustAcquire(t, l, resource, time.Minute) // never released nor renewed

	hctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	ahead := make(chan acquired, 3)
	for i := range 3 {
		startWaiter(hctx, l, "ahead", resource, time.Second, ahead)
		waitQueued(t, c, l, resource, int64(i+1))
	}
	next := make(chan acquired, 1)
	startWaiter(ctx, l, "next", resource, time.Second, next)
	waitQueued(t, c, l, resource, 4)

	// Just after the fourth's refresh, the lease has 200ms left.
	afterRefresh(t, c, l, resource, 3)
	end := time.Now().Add(200 * time.Millisecond)
	if err := c.PExpire(ctx, keysOf(l).LockKey(resource), 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	giveUp()
	for range 3 {
		if a := <-ahead; a.err == nil {
			t.Fatal("a waiter that gave up got the lock")
		}
	}
	a := receive(t, next, 5*time.Second)
	late := time.Since(end)
	t.Logf("three waiters ahead gave up 200ms before the lease's end; the next waiter got the lock %v after it", late.Round(time.Millisecond))
	if late > leaveBound {
		t.Errorf("the next waiter got the lock %v after the lease ended, want within %v", late, leaveBound)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestVanishedHeadCostsAtMostItsLease: a holder renewing a 300ms lease and
// the head of the queue are both cut off from Redis (the head's entry still
// live), just after the next waiter refreshed its entry. The next waiter
// tries soon after the lease's end, which hands the lock to the vanished
// head (its entry says it is alive) for the 100ms lease it asked for, and
// takes the lock when that runs out, not at its next refresh.
func TestVanishedHeadCostsAtMostItsLease(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	const resource = "headcut"
	srv := testenv.StartRedis(t)
	c := srv.Client()
	prefix := testenv.Prefix(t)
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	hl, hp := cutOff(t, srv, prefix)
	cl, p := cutOff(t, srv, prefix)

	if _, err := hl.TryAcquire(ctx, resource, 300*time.Millisecond, lock.AutoRenew()); err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	head := make(chan acquired, 1)
	startWaiter(hctx, cl, "head", resource, 100*time.Millisecond, head)
	waitQueued(t, c, l, resource, 1)
	next := make(chan acquired, 1)
	startWaiter(ctx, l, "next", resource, time.Second, next)
	waitQueued(t, c, l, resource, 2)

	afterRefresh(t, c, l, resource, 1)
	hp.Block()
	p.Block()
	asked := time.Now()
	pttl, err := c.PTTL(ctx, keysOf(l).LockKey(resource)).Result()
	if err != nil || pttl < 0 {
		t.Fatalf("the holder's lease: PTTL %v, %v", pttl, err)
	}
	end := asked.Add(pttl)
	a := receive(t, next, 5*time.Second)
	late := time.Since(end)
	t.Logf("the holder and the head (100ms lease) were cut off; the next waiter got the lock %v after the holder's lease ended", late.Round(time.Millisecond))
	if late > vanishBound {
		t.Errorf("the next waiter got the lock %v after the lease ended, want within %v", late, vanishBound)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
}

// TestVanishedWaitersCostAtMostTheirLeases: two waiters at the head of the
// queue are cut off from Redis (their entries still live), each having
// asked for a 100ms lease, and the holder releases. The release hands the
// lock to the first; the live third waiter behind them gets it once each
// vanished waiter's lease has run out, about 2 x (100ms + a try), not at
// its next refresh (the release comes just after its last one).
func TestVanishedWaitersCostAtMostTheirLeases(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	const resource = "twocut"
	srv := testenv.StartRedis(t)
	c := srv.Client()
	prefix := testenv.Prefix(t)
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	cl, p := cutOff(t, srv, prefix)

	holder := mustAcquire(t, l, resource, 30*time.Second)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	cut := make(chan acquired, 2)
	startWaiter(cctx, cl, "cut1", resource, 100*time.Millisecond, cut)
	waitQueued(t, c, l, resource, 1)
	startWaiter(cctx, cl, "cut2", resource, 100*time.Millisecond, cut)
	waitQueued(t, c, l, resource, 2)
	live := make(chan acquired, 1)
	startWaiter(ctx, l, "live", resource, time.Second, live)
	waitQueued(t, c, l, resource, 3)

	afterRefresh(t, c, l, resource, 2)
	p.Block()
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, live, 5*time.Second)
	late := time.Since(released)
	t.Logf("two cut-off waiters (100ms leases) ahead: the live waiter got the lock %v after the release", late.Round(time.Millisecond))
	if late > vanishBound {
		t.Errorf("the live waiter got the lock %v after the release, want within %v", late, vanishBound)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
}

// TestVanishedWaiterOfALongLease is the case a hand-over of a lease of a
// second or more makes: the queue is not announced after the grant (its
// waiters learn their places from their own refreshes, within a second),
// so a live waiter behind a vanished one, handed the lock for 1.5 s,
// must still take it once that lease has run out, within the bound the
// short leases' case allows.
func TestVanishedWaiterOfALongLease(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	const resource = "longcut"
	const cutLease = 1500 * time.Millisecond
	srv := testenv.StartRedis(t)
	c := srv.Client()
	prefix := testenv.Prefix(t)
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	cl, p := cutOff(t, srv, prefix)

	holder := mustAcquire(t, l, resource, 30*time.Second)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	cut := make(chan acquired, 1)
	startWaiter(cctx, cl, "cut", resource, cutLease, cut)
	waitQueued(t, c, l, resource, 1)
	live := make(chan acquired, 1)
	startWaiter(ctx, l, "live", resource, time.Second, live)
	waitQueued(t, c, l, resource, 2)

	afterRefresh(t, c, l, resource, 1)
	p.Block()
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, live, 10*time.Second)
	late := time.Since(released)
	t.Logf("a cut-off waiter handed a %v lease ahead: the live waiter got the lock %v after the release", cutLease, late.Round(time.Millisecond))
	if late < cutLease {
		t.Errorf("the live waiter got the lock %v after the release, before the vanished waiter's %v lease ended", late, cutLease)
	}
	if late > cutLease+vanishBound {
		t.Errorf("the live waiter got the lock %v after the release, want within %v (the vanished waiter's lease, then %v)", late, cutLease+vanishBound, vanishBound)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
}
