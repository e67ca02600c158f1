package lock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// The uncontended path: a grant with nobody queued, and its release.

// nextMessage subscribes to l's release channel of resource and returns a
// function that gives the next message published on it.
func nextMessage(t *testing.T, c *redis.Client, l *lock.Locker, resource string) func() string {
	t.Helper()
	ctx := context.Background()
	ps := c.Subscribe(ctx, keysOf(l).ReleaseChannel(resource))
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	return func() string {
		t.Helper()
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return msg.Payload
	}
}

// A release with nobody queued publishes nothing: no waiter needs the
// message. A marker published after the release is the first message the
// channel carries (Redis runs both in order).
func TestUncontendedReleasePublishesNothing(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	next := nextMessage(t, c, l, "quiet")
	for range 3 {
		lease := mustAcquire(t, l, "quiet", time.Minute)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Publish(ctx, keysOf(l).ReleaseChannel("quiet"), "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "marker" {
		t.Fatalf("an uncontended release published %q", got)
	}
}

// queueLapsed puts holder in resource's wait queue with an entry that
// lapsed ten seconds ago: a waiter that vanished.
func queueLapsed(t *testing.T, c redis.Cmdable, l *lock.Locker, resource, holder string) {
	t.Helper()
	ctx := context.Background()
	queue, waiting := queueKeys(l, resource)
	at := time.Now().Add(-10 * time.Second).UnixMicro()
	if err := c.HSet(ctx, waiting, holder, strconv.FormatInt(at, 10)+" 3000 30000 ").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, queue, redis.Z{Score: float64(at), Member: holder}).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), queue, waiting) })
}

// A release that finds only lapsed waiters in the queue still announces
// that the lock is free (a waiter whose entry lapsed may still be waiting),
// and leaves the queue empty.
func TestReleaseAnnouncesToLapsedWaiters(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	lease := mustAcquire(t, l, "lapsed", time.Minute)
	queueLapsed(t, c, l, "lapsed", "gone")
	next := nextMessage(t, c, l, "lapsed")
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "" {
		t.Fatalf("the release published %q, want the empty message", got)
	}
	queue, _ := queueKeys(l, "lapsed")
	if n := c.Exists(ctx, queue, keysOf(l).LockKey("lapsed")).Val(); n != 0 {
		t.Fatalf("%d of the queue and the lock left after the release", n)
	}
}

// A TryAcquire that finds the lock free and only a lapsed waiter queued
// takes the lock (the waiter is passed over), with a token above the last
// one, and clears the queue, so the next grant is uncontended again.
func TestTryAcquirePassesOverLapsedWaiters(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	first := mustAcquire(t, l, "stale-queue", time.Minute)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	queueLapsed(t, c, l, "stale-queue", "gone")
	lease := mustAcquire(t, l, "stale-queue", time.Minute)
	if lease.Fence().Token <= first.Fence().Token {
		t.Fatalf("token %d after %d", lease.Fence().Token, first.Fence().Token)
	}
	queue, waiting := queueKeys(l, "stale-queue")
	if n := c.Exists(ctx, queue, waiting).Val(); n != 0 {
		t.Fatalf("%d queue keys left after the lapsed waiter was passed over", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Releases of one lease from several goroutines at once: one releases it,
// the others find it released, and each sends its own arguments (the
// first release's live in the lease's hold, so a second one must not
// write them while the first call may still read them: the race detector
// sees it if it does). With an owner the release sends the acquisition id
// too.
func TestConcurrentReleasesOfOneLease(t *testing.T) {
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	ctx := context.Background()
	for _, owner := range []bool{false, true} {
		var opts []lock.AcquireOption
		if owner {
			opts = append(opts, lock.Owner("job"))
		}
		for round := range 20 {
			lease, err := l.TryAcquire(ctx, "concurrent-release", time.Minute, opts...)
			if err != nil {
				t.Fatal(err)
			}
			const n = 4
			errs := make(chan error, n)
			start := make(chan struct{})
			for range n {
				go func() {
					<-start
					errs <- lease.Release(ctx)
				}()
			}
			close(start)
			released := 0
			for range n {
				switch err := <-errs; {
				case err == nil:
					released++
				case !errors.Is(err, lock.ErrNotHeld):
					t.Fatalf("owner %v, round %d: Release = %v, want nil or ErrNotHeld", owner, round, err)
				}
			}
			if released != 1 {
				t.Fatalf("owner %v, round %d: %d of %d concurrent releases succeeded, want 1", owner, round, released, n)
			}
			if n, err := c.Exists(ctx, keysOf(l).LockKey("concurrent-release")).Result(); err != nil || n != 0 {
				t.Fatalf("owner %v, round %d: the lock key is still there after the releases (%d, %v)", owner, round, n, err)
			}
		}
	}
}
