package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// queueKeys returns resource's wait queue and waiter entries keys, which
// sit next to its lock key.
func queueKeys(l *lock.Locker, resource string) (queue, waiting string) {
	base := strings.TrimSuffix(keysOf(l).LockKey(resource), ":lock")
	return base + ":queue", base + ":waiting"
}

// waitQueued polls until resource's wait queue holds n waiters, for up to
// 30s: a loaded machine was seen to take over 10s to subscribe and queue
// three waiters.
func waitQueued(t *testing.T, c redis.UniversalClient, l *lock.Locker, resource string, n int64) {
	t.Helper()
	queue, _ := queueKeys(l, resource)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got, err := c.ZCard(context.Background(), queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not %d waiters queued within 30s", queue, n)
}

// waiterAndHolder returns two Lockers on the same keys, each with a client
// of its own, as two processes would have: the waiter's, whose client
// records what it sends in hook, and the holder's, with its client hc.
func waiterAndHolder(t *testing.T) (hook *testenv.Commands, wl *lock.Locker, hc *redis.Client, hl *lock.Locker) {
	t.Helper()
	hook = new(testenv.Commands)
	wc := testenv.Redis(t)
	wc.AddHook(hook)
	prefix := testenv.Prefix(t)
	wl, err := lock.New(wc, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wl.Close)
	hc = testenv.Redis(t)
	if hl, err = lock.New(hc, lock.WithPrefix(prefix)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hl.Close)
	return hook, wl, hc, hl
}

// wantHolder fails t unless resource's lock key holds holder.
func wantHolder(t *testing.T, c redis.UniversalClient, l *lock.Locker, resource, holder string) {
	t.Helper()
	if v, err := c.Get(context.Background(), keysOf(l).LockKey(resource)).Result(); err != nil || v != holder {
		t.Fatalf("lock key holds %q (%v), want holder %q", v, err, holder)
	}
}

type acquired struct {
	name  string
	lease *lock.Lease
	err   error
}

// startWaiter runs Acquire in a goroutine and reports on got.
func startWaiter(ctx context.Context, l *lock.Locker, name, resource string, ttl time.Duration, got chan<- acquired, opts ...lock.AcquireOption) {
	go func() {
		lease, err := l.Acquire(ctx, resource, ttl, opts...)
		got <- acquired{name, lease, err}
	}()
}

func receive(t *testing.T, got <-chan acquired, within time.Duration) acquired {
	t.Helper()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatalf("%s: %v", a.name, a.err)
		}
		return a
	case <-time.After(within):
		t.Fatalf("no grant within %v", within)
	}
	return acquired{}
}

// Waiters are granted the lock in the order they queued, across Lockers
// (each with its own client, as separate processes would be), each by the
// release before, with a higher token each time.
func TestQueueGrantsInArrivalOrder(t *testing.T) {
	ctx := context.Background()
	const resource = "fifo"
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	var lockers []*lock.Locker
	for range 3 {
		cl := testenv.Redis(t)
		l, err := lock.New(cl, lock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		lockers = append(lockers, l)
	}
	const ttl = 30 * time.Second
	holder := mustAcquire(t, lockers[0], resource, ttl)
	got := make(chan acquired, 6)
	names := []string{"a", "b", "c", "d", "e", "f"}
	for i, name := range names {
		startWaiter(ctx, lockers[i%3], name, resource, ttl, got)
		waitQueued(t, c, lockers[0], resource, int64(i+1))
	}
	prev := holder
	for _, want := range names {
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a := receive(t, got, 5*time.Second)
		if a.name != want {
			t.Fatalf("granted to %s, want %s (arrival order)", a.name, want)
		}
		if a.lease.Fence().Token <= prev.Fence().Token {
			t.Fatalf("token %d after %d", a.lease.Fence().Token, prev.Fence().Token)
		}
		prev = a.lease
	}
	if err := prev.Release(ctx); err != nil {
		t.Fatal(err)
	}
	queue, waiting := queueKeys(lockers[0], resource)
	if n, err := c.Exists(ctx, queue, waiting, keysOf(lockers[0]).LockKey(resource)).Result(); err != nil || n != 0 {
		t.Fatalf("%d of queue, entries and lock key left after the last release (%v)", n, err)
	}
}

// The release grants the lock to the queued waiter in its own script: the
// waiter sends nothing between queueing and having the lock, so a
// contended grant costs two commands (the try that queued, the release).
func TestHandOverCostsTheWaiterNoCommand(t *testing.T) {
	ctx := context.Background()
	const resource = "handover"
	hook, wl, hc, hl := waiterAndHolder(t)

	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, wl, "w", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	before := hook.Take()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, got, 5*time.Second)
	if after := hook.Take(); len(after) != 0 {
		t.Fatalf("the waiter sent %v after it was queued; want nothing", after)
	}
	t.Logf("the waiter sent %v to queue", before)
	wantHolder(t, hc, hl, resource, a.lease.Fence().Holder)
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lease handed over by a release is never believed held longer than
// Redis holds it, and is not needlessly short either: it is dated from the
// waiter's last queue refresh plus the time the server says passed until
// the grant.
func TestHandedOverLeaseValidity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "dated"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	const ttl = 2 * time.Second
	holder := mustAcquire(t, l, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, l, "w", resource, ttl, got, lock.AutoRenew())
	waitQueued(t, c, l, resource, 1)
	time.Sleep(300 * time.Millisecond) // the entry ages before the grant
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, got, 5*time.Second)
	// Redis first, then the lease: validity read later must not exceed
	// what Redis held earlier.
	pttl, err := c.PTTL(ctx, keysOf(l).LockKey(resource)).Result()
	if err != nil {
		t.Fatal(err)
	}
	validity := a.lease.Validity()
	t.Logf("validity %v, PTTL %v", validity, pttl)
	if validity > pttl+time.Millisecond {
		t.Fatalf("validity %v is beyond what Redis holds (%v)", validity, pttl)
	}
	if validity < ttl/2 {
		t.Fatalf("validity %v of a %v lease just granted", validity, ttl)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A queue entry whose waiter stopped refreshing it (a crashed process) is
// passed over; one that is still live is granted the lock, which then
// waits out that grant's lease.
func TestQueuePassesOverVanishedWaiters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "vanished"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	queue, waiting := queueKeys(l, resource)
	holder := mustAcquire(t, l, resource, 30*time.Second)

	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := tm.UnixMicro()
	// Two entries ahead of any real waiter: one 10s stale, one fresh, whose
	// lease is 300ms.
	stale, live := strings.Repeat("5", 32), strings.Repeat("6", 32)
	if err := c.HSet(ctx, waiting,
		stale, fmt.Sprintf("%d 3000 30000 ", now-10_000_000),
		live, fmt.Sprintf("%d 3000 300 ", now)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, queue, redis.Z{Score: 1, Member: stale}, redis.Z{Score: 2, Member: live}).Err(); err != nil {
		t.Fatal(err)
	}
	got := make(chan acquired, 1)
	startWaiter(ctx, l, "w", resource, 30*time.Second, got)
	waitQueued(t, c, l, resource, 3)

	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantHolder(t, c, l, resource, live)
	a := receive(t, got, 5*time.Second)
	waited := time.Since(released)
	t.Logf("the real waiter got the lock %v after the release", waited)
	if waited < 250*time.Millisecond {
		t.Fatalf("granted after %v, before the live entry's 300ms lease could end", waited)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, queue, waiting).Result(); n != 0 {
		t.Fatalf("%d queue keys left", n)
	}
}

// A waiter that gives up takes its entry out of the queue, and a grant
// that a release made to it while it was giving up is handed on, never
// kept: the next waiter always gets the lock at once.
func TestWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	ctx := context.Background()
	const resource = "giveup"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	queue, waiting := queueKeys(l, resource)

	holder := mustAcquire(t, l, resource, 30*time.Second)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := l.Acquire(wctx, resource, 30*time.Second)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v, want the deadline", err)
	}
	// It leaves the queue in the background, since its context has ended.
	eventually(t, "the waiter that gave up is still queued", func() bool {
		return c.ZCard(ctx, queue).Val() == 0 && c.HLen(ctx, waiting).Val() == 0
	})

	// The race: give up while the holder releases, many times.
	for i := range 40 {
		wctx, cancel := context.WithCancel(ctx)
		first := make(chan acquired, 1)
		startWaiter(wctx, l, "first", resource, 30*time.Second, first)
		waitQueued(t, c, l, resource, 1)
		second := make(chan acquired, 1)
		startWaiter(ctx, l, "second", resource, 30*time.Second, second)
		waitQueued(t, c, l, resource, 2)
		go func() {
			time.Sleep(time.Duration(i%8) * 50 * time.Microsecond)
			cancel()
		}()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		f := <-first
		if f.err == nil {
			// It won the race: it holds the lock; release it to the second.
			if err := f.lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		holder = receive(t, second, 5*time.Second).lease
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Wrong-typed queue keys left in Redis: a waiter's try is refused with an
// error naming the key and changes nothing, and releases still free the
// lock.
func TestQueueKeysOfTheWrongType(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	for _, tc := range []struct {
		name, key, want string
	}{
		{"queue", "queue", "wait queue"},
		{"entries", "waiting", "waiter entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resource := "wrongtype-" + tc.name
			queue, waiting := queueKeys(l, resource)
			key := queue
			if tc.key == "waiting" {
				key = waiting
			}
			if err := c.Set(ctx, key, "not mine", 0).Err(); err != nil {
				t.Fatal(err)
			}
			holder := mustAcquire(t, l, resource, 30*time.Second)
			// Acquire queues once its subscription is confirmed.
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := l.Acquire(actx, resource, time.Second)
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Acquire: %v, want a WRONGTYPE error naming the %s", err, tc.want)
			}
			if v, err := c.Get(ctx, key).Result(); err != nil || v != "not mine" {
				t.Fatalf("%s now holds %q (%v)", key, v, err)
			}
			other := queue
			if key == queue {
				other = waiting
			}
			if n, _ := c.Exists(ctx, other).Result(); n != 0 {
				t.Fatalf("%s was written", other)
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatalf("release with a wrong-typed %s: %v", tc.want, err)
			}
			if n, _ := c.Exists(ctx, keysOf(l).LockKey(resource)).Result(); n != 0 {
				t.Fatal("the lock is still held after the release")
			}
		})
	}
}

// A waiter that names an owner is handed the lock with its hold record, so
// it re-enters and releases as any owner's lease does.
func TestHandOverToAnOwner(t *testing.T) {
	ctx := context.Background()
	const resource = "owned"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	holder := mustAcquire(t, l, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, l, "job", resource, 30*time.Second, got, lock.Owner("job-7"))
	waitQueued(t, c, l, resource, 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := receive(t, got, 5*time.Second).lease
	again, err := l.TryAcquire(ctx, resource, 30*time.Second, lock.Owner("job-7"))
	if err != nil {
		t.Fatalf("re-entry after a hand-over: %v", err)
	}
	if again.Fence() != first.Fence() {
		t.Fatalf("re-entry fence %v, want %v", again.Fence(), first.Fence())
	}
	if _, err := l.TryAcquire(ctx, resource, time.Second, lock.Owner("job-8")); !errors.As(err, new(*lock.NotAcquiredError)) {
		t.Fatalf("another owner: %v, want refused", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, keysOf(l).LockKey(resource)).Result(); n != 1 {
		t.Fatal("the lock was freed with a hold left")
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, keysOf(l).LockKey(resource)).Result(); n != 0 {
		t.Fatal("the lock is held after the last hold was released")
	}
}

// A grant whose message never reaches the waiter (its connections were
// cut just before the release) is found by the waiter's next try, which
// the lost subscription makes come soon.
func TestHandOverSurvivesALostMessage(t *testing.T) {
	ctx := context.Background()
	const resource = "lostmsg"
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	hc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = hc.Close() })
	hl := newLocker(t, hc, lock.WithPrefix(strings.TrimSuffix(keysOf(l).LockKey(resource), "{"+resource+"}:lock")))
	t.Cleanup(hl.Close)

	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, l, "w", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	proxy.CutAll() // the subscription with it: the grant's message is lost
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := hc.Get(ctx, keysOf(hl).LockKey(resource)).Result(); err != nil || len(v) != 32 {
		t.Fatalf("lock key holds %q (%v) after the release, want the waiter's holder", v, err)
	}
	a := receive(t, got, 5*time.Second)
	t.Logf("the waiter had its grant %v after the release", time.Since(released))
	wantHolder(t, hc, hl, resource, a.lease.Fence().Holder)
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The entry a waiter refreshes keeps its place in the queue.
func TestQueueRefreshKeepsPlace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "refresh"
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	queue, waiting := queueKeys(l, resource)
	holder := mustAcquire(t, l, resource, 1500*time.Millisecond)
	got := make(chan acquired, 1)
	startWaiter(ctx, l, "w", resource, 30*time.Second, got)
	waitQueued(t, c, l, resource, 1)
	first, err := c.ZRangeWithScores(ctx, queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	entry, err := c.HGet(ctx, waiting, first[0].Member.(string)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The waiter refreshes when the holder's lease would end (1.5s) or
	// every second, whichever is first.
	deadline := time.Now().Add(5 * time.Second)
	for {
		now, err := c.HGet(ctx, waiting, first[0].Member.(string)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now != entry {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the entry was not refreshed within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	again, err := c.ZRangeWithScores(ctx, queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || again[0] != first[0] {
		t.Fatalf("queue after a refresh %v, want %v", again, first)
	}
	ref, _, _ := strings.Cut(entry, " ")
	if _, err := strconv.ParseInt(ref, 10, 64); err != nil {
		t.Fatalf("entry %q", entry)
	}
	if err := holder.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		t.Fatal(err)
	}
	a := receive(t, got, 5*time.Second)
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A resource's channel stays subscribed for a while after its last waiter
// in the Locker left: the Locker's next Acquire of it queues with its first
// try, with no subscribe and no second try. Then the channel is dropped.
func TestSubscriptionLingersForTheNextAcquire(t *testing.T) {
	ctx := context.Background()
	const resource = "linger"
	hook, wl, hc, hl := waiterAndHolder(t)
	channel := keysOf(wl).ReleaseChannel(resource)

	for round := range 2 {
		holder := mustAcquire(t, hl, resource, 30*time.Second)
		hook.Take()
		got := make(chan acquired, 1)
		// A short lease, left to run out: a release would announce the
		// lock free, and that message, if late, would wake the next
		// round's waiter for a second try.
		startWaiter(ctx, wl, "w", resource, 100*time.Millisecond, got)
		waitQueued(t, hc, hl, resource, 1)
		sent := hook.Take()
		if round == 1 {
			// The channel lingered from round 0: one try, which queued.
			if len(sent) != 1 || sent[0] != "evalsha" {
				t.Fatalf("the second Acquire sent %v before it was queued; want one evalsha", sent)
			}
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		receive(t, got, 5*time.Second)
		eventually(t, "the waiter's lease did not run out", keyGone(hc, keysOf(hl).LockKey(resource)))
		waitSubscribed(t, hc, channel, 1) // still subscribed after its waiter left
	}
	start := time.Now()
	waitSubscribers(t, hc, channel, func(n int64) bool { return n == 0 })
	t.Logf("unsubscribed %v after the last waiter left", time.Since(start))
}

// Client retries of a run that already happened (go-redis retries after a
// lost reply): a queued try run twice queues its waiter once, and a release
// that handed the lock over, run twice, hands it over once and leaves the
// new holder's lock alone.
func TestQueueSurvivesClientRetries(t *testing.T) {
	ctx := context.Background()
	const resource = "replayed"
	var wreplay, hreplay testenv.Replay
	_, wl, hc, hl := waiterAndHolder(t)
	hc.AddHook(&hreplay)
	queue, _ := queueKeys(hl, resource)
	wc := testenv.Redis(t)
	wc.AddHook(&wreplay)
	rl, err := lock.New(wc, lock.WithPrefix(strings.TrimSuffix(keysOf(hl).LockKey(resource), "{"+resource+"}:lock")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rl.Close)

	// A first round for each waiter Locker leaves its channel subscribed,
	// so that its next Acquire's first command is a try that queues.
	got := make(chan acquired, 2)
	for _, l := range []*lock.Locker{wl, rl} {
		holder := mustAcquire(t, hl, resource, 30*time.Second)
		startWaiter(ctx, l, "warm", resource, 30*time.Second, got)
		waitQueued(t, hc, hl, resource, 1)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := receive(t, got, 5*time.Second).lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	holder := mustAcquire(t, hl, resource, 30*time.Second)
	startWaiter(ctx, wl, "first", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	wreplay.Arm(0) // the second waiter's queueing try runs twice
	startWaiter(ctx, rl, "second", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 2)
	time.Sleep(20 * time.Millisecond)
	if n, _ := hc.ZCard(ctx, queue).Result(); n != 2 {
		t.Fatalf("%d queued after a replayed queueing try, want 2", n)
	}

	hreplay.Arm(0)
	if err := holder.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		// The replay's own reply: the first run freed the lock already.
		t.Fatalf("replayed release: %v, want ErrNotHeld", err)
	}
	first := receive(t, got, 5*time.Second)
	if first.name != "first" {
		t.Fatalf("granted to %s, want first", first.name)
	}
	if v, _ := hc.Get(ctx, keysOf(hl).LockKey(resource)).Result(); v != first.lease.Fence().Holder {
		t.Fatalf("lock key holds %q after the replayed release, want the first waiter's %q", v, first.lease.Fence().Holder)
	}
	if n, _ := hc.ZCard(ctx, queue).Result(); n != 1 {
		t.Fatalf("%d queued after one hand-over, want the second waiter only", n)
	}
	if err := first.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := receive(t, got, 5*time.Second)
	if second.name != "second" || second.lease.Fence().Token <= first.lease.Fence().Token {
		t.Fatalf("then %s with token %d after %d", second.name, second.lease.Fence().Token, first.lease.Fence().Token)
	}
	if err := second.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Waiters over four Lockers that often give up while queued, some of them
// just as a release hands them the lock: leases never overlap, tokens keep
// increasing, no grant is stranded with a waiter that left (the lock would
// then sit idle for a whole 30s lease and the run would stall), and once
// everyone is done the lock is free and the queue is gone.
func TestQueueWithWaitersGivingUp(t *testing.T) {
	testenv.Slow(t)
	ctx := context.Background()
	const resource = "giveups"
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	var lockers []*lock.Locker
	for range 4 {
		l, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		lockers = append(lockers, l)
	}
	const lease = 30 * time.Second
	var (
		inside          atomic.Int32
		lastToken       atomic.Int64
		granted, gaveUp atomic.Int64
		wg              sync.WaitGroup
		deadline        = time.Now().Add(2 * time.Second)
	)
	for w := range 16 {
		l := lockers[w%4]
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				// Every third try gives up after a short, varying wait.
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if (w+i)%3 == 0 {
					actx, cancel = context.WithTimeout(ctx, time.Duration(200+(w*37+i*91)%1800)*time.Microsecond)
				}
				l, err := l.Acquire(actx, resource, lease)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					gaveUp.Add(1)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				granted.Add(1)
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				if prev := lastToken.Swap(int64(l.Fence().Token)); prev >= int64(l.Fence().Token) {
					t.Errorf("token %d after %d", l.Fence().Token, prev)
				}
				time.Sleep(100 * time.Microsecond)
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d waits given up", granted.Load(), gaveUp.Load())
	if granted.Load() < 100 || gaveUp.Load() < 10 {
		t.Fatalf("%d grants and %d give-ups: the run did not exercise the queue", granted.Load(), gaveUp.Load())
	}
	queue, waiting := queueKeys(lockers[0], resource)
	if n, err := c.Exists(ctx, keysOf(lockers[0]).LockKey(resource), queue, waiting).Result(); err != nil || n != 0 {
		t.Fatalf("%d of lock, queue and entries left after everyone left (%v)", n, err)
	}
}

// A server that refuses the queue's commands (an ACL without ZADD) makes a
// waiting Acquire fail with the server's own refusal and what it was doing,
// leaving nothing behind, instead of a misleading type error or a silent
// wait.
func TestQueueRefusedByACL(t *testing.T) {
	ctx := context.Background()
	const resource = "acl"
	srv := testenv.StartRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(ctx, "ACL", "SETUSER", "fk", "on", ">pw", "~*", "&*", "+@all", "-zadd").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "fk", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	holder := mustAcquire(t, l, resource, 30*time.Second)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := l.Acquire(actx, resource, time.Second)
	if err == nil || errors.Is(err, fence.ErrWrongType) || !strings.Contains(err.Error(), "wait queue") {
		t.Fatalf("Acquire under an ACL without ZADD: %v, want the server's refusal, saying it was joining the wait queue", err)
	}
	t.Logf("Acquire: %v", err)
	queue, waiting := queueKeys(l, resource)
	if n, _ := admin.Exists(ctx, queue, waiting).Result(); n != 0 {
		t.Fatalf("%d queue keys written by a refused try", n)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("release under the ACL: %v", err)
	}
}

// A holder that vanishes without releasing: when its lease runs out, the
// lock still goes to the queued waiters in arrival order. Whichever waiter
// tries first hands the lock to the head of the queue and stays queued.
func TestQueueOrderHoldsAfterALostLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "lostlease"
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	var lockers []*lock.Locker
	for range 3 {
		l, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		lockers = append(lockers, l)
	}
	for round := range 3 {
		// Never released. Its lease is long enough for the three waiters
		// to queue on a loaded machine, and is cut short in Redis once they
		// have: it runs out then, as a vanished holder's does.
		gone := mustAcquire(t, lockers[0], resource, 30*time.Second)
		got := make(chan acquired, 3)
		// Queued in the order c, b, a, each in its own Locker.
		names := []string{"c", "b", "a"}
		for i, name := range names {
			startWaiter(ctx, lockers[(i+round)%3], name, resource, 30*time.Second, got)
			waitQueued(t, c, lockers[0], resource, int64(i+1))
		}
		if err := c.PExpire(ctx, keysOf(lockers[0]).LockKey(resource), 300*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		prev := gone
		for _, want := range names {
			a := receive(t, got, 5*time.Second)
			if a.name != want {
				t.Fatalf("round %d: granted to %s, want %s (arrival order)", round, a.name, want)
			}
			if a.lease.Fence().Token <= prev.Fence().Token {
				t.Fatalf("token %d after %d", a.lease.Fence().Token, prev.Fence().Token)
			}
			if err := a.lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			prev = a.lease
		}
	}
}

// A queueing try that finds the lock free with a waiter ahead of it hands
// the lock to that waiter; run twice by the client, it hands it over once
// and queues the caller once.
func TestFreeLockHandOverSurvivesClientRetry(t *testing.T) {
	ctx := context.Background()
	const resource = "freeretry"
	var replay testenv.Replay
	_, wl, hc, hl := waiterAndHolder(t)
	queue, _ := queueKeys(hl, resource)
	rc := testenv.Redis(t)
	rc.AddHook(&replay)
	rl, err := lock.New(rc, lock.WithPrefix(strings.TrimSuffix(keysOf(hl).LockKey(resource), "{"+resource+"}:lock")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rl.Close)

	// A first round leaves rl's channel subscribed, so that its next
	// Acquire's first command is a try that queues.
	got := make(chan acquired, 2)
	holder := mustAcquire(t, hl, resource, 30*time.Second)
	startWaiter(ctx, rl, "warm", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, got, 5*time.Second).lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	holder = mustAcquire(t, hl, resource, 30*time.Second)
	startWaiter(ctx, wl, "first", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	// The holder vanishes; the first waiter's own next try is a second away.
	if err := hc.Del(ctx, keysOf(hl).LockKey(resource)).Err(); err != nil {
		t.Fatal(err)
	}
	replay.Arm(0)
	startWaiter(ctx, rl, "second", resource, 30*time.Second, got)
	first := receive(t, got, 500*time.Millisecond)
	if first.name != "first" || first.lease.Fence().Token <= holder.Fence().Token {
		t.Fatalf("%s granted token %d after %d, want first", first.name, first.lease.Fence().Token, holder.Fence().Token)
	}
	waitQueued(t, hc, hl, resource, 1)
	wantHolder(t, hc, hl, resource, first.lease.Fence().Holder)
	if n, _ := hc.ZCard(ctx, queue).Result(); n != 1 {
		t.Fatalf("%d queued, want the second waiter once", n)
	}
	if err := first.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := receive(t, got, 5*time.Second)
	if second.name != "second" || second.lease.Fence().Token <= first.lease.Fence().Token {
		t.Fatalf("then %s with token %d after %d", second.name, second.lease.Fence().Token, first.lease.Fence().Token)
	}
	if err := second.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant found late (its message held up on a silent subscription) starts
// with little of its lease left; AutoRenew renews it from what is left, not
// a third of its ttl after Acquire returned, which would be after Redis let
// it go.
func TestRenewalOfAGrantFoundLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		resource = "late"
		ttl      = 3 * time.Second
	)
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	wc := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = wc.Close() })
	wl := newLocker(t, wc)
	t.Cleanup(wl.Close)
	hc := srv.Client()
	hl := newLocker(t, hc, lock.WithPrefix(strings.TrimSuffix(keysOf(wl).LockKey(resource), "{"+resource+"}:lock")))
	t.Cleanup(hl.Close)

	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, wl, "w", resource, ttl, got, lock.AutoRenew())
	waitQueued(t, hc, hl, resource, 1)
	// Just after a refresh, from which the grant dates the lease: a
	// release up to a second after it left the lease (1.5s, aged 1.1s)
	// nothing on a loaded machine.
	afterRefresh(t, hc, hl, resource, 0)
	proxy.Block() // the waiter hears nothing for a while
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The grant ages unheard for half its lease, leaving well over a
	// second for a loaded machine to deliver it.
	time.Sleep(1500 * time.Millisecond)
	proxy.Unblock()
	a := receive(t, got, 5*time.Second)
	t.Logf("granted with %v of its %v left", a.lease.Validity(), ttl)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := a.lease.Err(); err != nil {
			t.Fatalf("the lease ran out before its first renewal: %v", err)
		}
	}
	wantHolder(t, hc, hl, resource, a.lease.Fence().Holder)
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A queued waiter that re-enters as its owner (the lock was handed to
// another waiter of the same owner meanwhile) leaves the queue: no later
// release hands the lock to its stale entry.
func TestReentryLeavesTheQueue(t *testing.T) {
	ctx := context.Background()
	const resource = "reentryq"
	_, wl, hc, hl := waiterAndHolder(t)
	queue, waiting := queueKeys(hl, resource)
	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 2)
	startWaiter(ctx, wl, "first", resource, 30*time.Second, got, lock.Owner("job"))
	waitQueued(t, hc, hl, resource, 1)
	startWaiter(ctx, wl, "second", resource, 30*time.Second, got, lock.Owner("job"))
	waitQueued(t, hc, hl, resource, 2)
	// The release hands the lock to the first waiter; the second, of the
	// same owner, then re-enters it.
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := receive(t, got, 5*time.Second), receive(t, got, 5*time.Second)
	if a.lease.Fence() != b.lease.Fence() {
		t.Fatalf("re-entry fence %v, want %v", b.lease.Fence(), a.lease.Fence())
	}
	if n, h := hc.ZCard(ctx, queue).Val(), hc.HLen(ctx, waiting).Val(); n != 0 || h != 0 {
		t.Fatalf("after the re-entry: %d queued, %d entries; want none", n, h)
	}
	for _, l := range []*lock.Lease{a.lease, b.lease} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := hc.Exists(ctx, keysOf(hl).LockKey(resource)).Val(); n != 0 {
		t.Fatal("the lock is still held after both holds were released")
	}
}

// A newcomer's first Acquire try, made before its Locker has subscribed to
// the resource, respects the queue: a free lock with a live waiter queued
// ahead goes to that waiter (at once, by the hand-over's message), and the
// newcomer waits its turn.
func TestNewcomerRespectsTheQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const resource = "newcomer"
	_, wl, hc, hl := waiterAndHolder(t)
	nl, err := lock.New(testenv.Redis(t), lock.WithPrefix(strings.TrimSuffix(keysOf(hl).LockKey(resource), "{"+resource+"}:lock")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 2)
	startWaiter(ctx, wl, "queued", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	// The holder vanishes; the queued waiter's own next try is a second
	// away.
	if err := hc.Del(ctx, keysOf(hl).LockKey(resource)).Err(); err != nil {
		t.Fatal(err)
	}
	startWaiter(ctx, nl, "newcomer", resource, 30*time.Second, got)
	freed := time.Now()
	first := receive(t, got, 5*time.Second)
	if first.name != "queued" {
		t.Fatalf("%s got the lock first, want the waiter queued ahead", first.name)
	}
	// At once, by the hand-over's message, not at its next refresh.
	t.Logf("the queued waiter had the lock %v after the holder vanished", time.Since(freed))
	waitQueued(t, hc, hl, resource, 1)
	if err := first.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := receive(t, got, 5*time.Second)
	if second.name != "newcomer" || second.lease.Fence().Token <= first.lease.Fence().Token {
		t.Fatalf("then %s with token %d after %d", second.name, second.lease.Fence().Token, first.lease.Fence().Token)
	}
	if err := second.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Queued waiters behind a holder that keeps renewing a short lease do not
// all try at every predicted lease end: only the head does, and the others
// refresh their entry once a second, so the tries per waiter stay near one
// a second whatever the lease.
func TestQueuedWaitersTryOnlyAtTheHead(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	const (
		resource = "manywaiters"
		waiters  = 200
		window   = 2 * time.Second
	)
	hook, wl, hc, hl := waiterAndHolder(t)
	const lease = 300 * time.Millisecond
	holder, err := hl.TryAcquire(context.Background(), resource, lease, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan acquired, waiters)
	for i := range waiters {
		startWaiter(ctx, wl, strconv.Itoa(i), resource, time.Second, got)
	}
	// All queued, or nearly: on a loaded machine the holder may lose its
	// short lease meanwhile, and the head then holds the lock for a while.
	queue, _ := queueKeys(hl, resource)
	eventually(t, "the waiters did not queue", func() bool {
		return hc.ZCard(context.Background(), queue).Val() >= waiters-10
	})
	hook.Take()
	time.Sleep(window) // the measurement window
	if err := holder.Err(); err != nil {
		// Then the head holds a lease of its own for a while; the rest
		// still only refresh.
		t.Logf("the holder lost its lease during the measurement: %v", err)
	}
	tries := 0
	for _, name := range hook.Take() {
		if name == "evalsha" || name == "eval" {
			tries++
		}
	}
	perWaiter := float64(tries) / waiters / window.Seconds()
	t.Logf("%d waiters behind a renewed %v lease: %d tries in %v, %.2f per waiter per second", waiters, lease, tries, window, perWaiter)
	cancel()
	for range waiters {
		if a := <-got; a.err == nil {
			_ = a.lease.Release(context.Background())
		}
	}
	// Trying at every predicted lease end costs about one try per waiter
	// per 300ms (3.3 a second) on top of the refresh.
	if perWaiter > 2 {
		t.Fatalf("%.2f tries per waiter per second, want about one (a refresh a second)", perWaiter)
	}
	_ = holder.Release(context.Background())
}

// TestTryAcquireRespectsTheQueue: a TryAcquire that finds the lock free
// while a live waiter is queued does not take it: the lock goes to the
// head of the queue and TryAcquire is refused (DESIGN: every try that can
// take a free lock respects the queue).
func TestTryAcquireRespectsTheQueue(t *testing.T) {
	ctx := context.Background()
	const resource = "trynewcomer"
	_, wl, hc, hl := waiterAndHolder(t)
	nl, err := lock.New(testenv.Redis(t), lock.WithPrefix(strings.TrimSuffix(keysOf(hl).LockKey(resource), "{"+resource+"}:lock")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, wl, "queued", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)
	// The holder vanishes; the queued waiter's own next try is a second
	// away.
	if err := hc.Del(ctx, keysOf(hl).LockKey(resource)).Err(); err != nil {
		t.Fatal(err)
	}
	lease, err := nl.TryAcquire(ctx, resource, 30*time.Second)
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("TryAcquire took the free lock ahead of a live queued waiter")
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire: %v, want ErrNotAcquired", err)
	}
	first := receive(t, got, 5*time.Second)
	if first.name != "queued" {
		t.Fatalf("%s got the lock, want the waiter queued ahead", first.name)
	}
	if err := first.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter queued when its Locker is closed leaves the queue, since no
// grant message can reach it any more, and waits by timed retries that do
// not queue it again; it still gets the lock once the holder releases it.
// Its script calls are counted: every one of them after Close is a timed
// retry on the wait strategy, none refreshes a queue entry.
func TestAClosedLockerNoLongerQueues(t *testing.T) {
	const resource = "closedqueue"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook, wl, hc, hl := waiterAndHolder(t)
	queue, waiting := queueKeys(hl, resource)
	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	startWaiter(ctx, wl, "w", resource, 30*time.Second, got)
	waitQueued(t, hc, hl, resource, 1)

	hook.Take()
	wl.Close()
	closed := time.Now()
	deadline := closed.Add(3 * time.Second)
	for {
		n, err := hc.ZCard(ctx, queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter of a closed Locker still queued %v after Close, after %d script calls", time.Since(closed).Round(time.Millisecond), scriptCalls(hook.Take()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	left := time.Since(closed)
	hook.Take()
	const window = 2 * time.Second
	time.Sleep(window)
	calls := scriptCalls(hook.Take())
	t.Logf("the waiter left the queue %v after Close; then %d script calls in %v, on the wait strategy", left.Round(time.Millisecond), calls, window)
	if n, err := hc.ZCard(ctx, queue).Result(); err != nil || n != 0 {
		t.Fatalf("queue after %v of timed retries: %d waiters (%v), want 0", window, n, err)
	}
	if n, err := hc.HLen(ctx, waiting).Result(); err != nil || n != 0 {
		t.Fatalf("waiter entries after %v of timed retries: %d (%v), want 0", window, n, err)
	}
	if calls == 0 {
		t.Fatalf("no script call in %v after Close: the waiter stopped trying", window)
	}

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, got, 5*time.Second)
	if a.lease.Fence().Token <= holder.Fence().Token {
		t.Fatalf("token %d after %d", a.lease.Fence().Token, holder.Fence().Token)
	}
	if err := a.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// scriptCalls counts the script calls among names.
func scriptCalls(names []string) int {
	n := 0
	for _, name := range names {
		if name == "evalsha" || name == "eval" {
			n++
		}
	}
	return n
}

// abandonHook loses the reply of a waiter's first Abandon (the release
// script run with the waiter's "gave up" flag) without sending it, so that
// the Abandon goes on in the background, and holds that background run
// until hold is closed.
type abandonHook struct {
	n     atomic.Int32
	first chan struct{} // closed when the first Abandon was lost
	hold  chan struct{} // the background Abandon waits for it
	done  chan struct{} // closed when the background Abandon has run
}

func (h *abandonHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *abandonHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *abandonHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := cmd.Name()
		if (name != "evalsha" && name != "eval") || len(args) != 12 || args[len(args)-1] != "1" {
			return next(ctx, cmd)
		}
		switch h.n.Add(1) {
		case 1:
			err := errors.New("test: connection reset before the reply")
			cmd.SetErr(err)
			close(h.first)
			return err
		case 2:
			<-h.hold
			err := next(ctx, cmd)
			close(h.done)
			return err
		}
		return next(ctx, cmd)
	}
}

// A closing Locker's waiter whose leaving the queue lost its reply (so the
// Abandon goes on in the background) while a release hands it the lock:
// the waiter's later tries must not take for theirs a grant that the
// Abandon still on its way gives back. Either the hand-over is given back
// and goes on (here: the lock is free, and the waiter's next try takes it
// under a holder of its own), or it stays the waiter's; never both.
func TestClosingWaiterAndAHandOverRacingItsAbandon(t *testing.T) {
	const resource = "closingrace"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook := &abandonHook{first: make(chan struct{}), hold: make(chan struct{}), done: make(chan struct{})}
	wc := testenv.Redis(t)
	wc.AddHook(hook)
	prefix := testenv.Prefix(t)
	wl, err := lock.New(wc, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wl.Close)
	hc := testenv.Redis(t)
	hl, err := lock.New(hc, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hl.Close)
	holder := mustAcquire(t, hl, resource, 30*time.Second)
	got := make(chan acquired, 1)
	const waiterTTL = 5 * time.Second
	startWaiter(ctx, wl, "w", resource, waiterTTL, got)
	waitQueued(t, hc, hl, resource, 1)

	// Close waits for the calls the Locker left running, the background
	// Abandon among them, which the hook holds.
	go wl.Close()
	select {
	case <-hook.first:
	case <-time.After(10 * time.Second):
		t.Fatal("the closing waiter did not leave the queue within 10s")
	}
	// The Abandon's reply was lost: its entry is still queued when the
	// holder releases, so the release hands the lock to it.
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var early *acquired
	select {
	case a := <-got:
		early = &a
	case <-time.After(500 * time.Millisecond):
	}
	close(hook.hold)
	select {
	case <-hook.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the background Abandon did not run within 10s")
	}
	a := early
	if a == nil {
		r := receive(t, got, 10*time.Second)
		a = &r
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	// The Abandon has landed: a lease the waiter still believes in must be
	// the one Redis holds.
	if a.lease.Validity() <= 0 {
		t.Fatalf("the waiter's lease (ttl %v) already ended", waiterTTL)
	}
	if v, err := hc.Get(ctx, keysOf(hl).LockKey(resource)).Result(); err != nil || v != a.lease.Fence().Holder {
		t.Fatalf("the waiter believes it holds the lock (holder %s, token %d, validity %v), but the lock key holds %q (%v): the Abandon on its way gave back the grant its try took",
			a.lease.Fence().Holder, a.lease.Fence().Token, a.lease.Validity(), v, err)
	}
	if a.lease.Fence().Token <= holder.Fence().Token {
		t.Fatalf("token %d after %d", a.lease.Fence().Token, holder.Fence().Token)
	}
	_ = a.lease.Release(ctx)
}
