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

// waitSubscribed polls until channel has at least n subscribers.
func waitSubscribed(t *testing.T, c redis.UniversalClient, channel string, n int64) {
	t.Helper()
	waitSubscribers(t, c, channel, func(got int64) bool { return got >= n })
}

// waitSubscribers polls until channel's subscriber count satisfies ok.
func waitSubscribers(t *testing.T, c redis.UniversalClient, channel string, ok func(int64) bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var got int64
		if _, ok := c.(*redis.ClusterClient); ok {
			m, err := c.PubSubShardNumSub(ctx, channel).Result()
			if err != nil {
				t.Fatal(err)
			}
			got = m[channel]
		} else {
			m, err := c.PubSubNumSub(ctx, channel).Result()
			if err != nil {
				t.Fatal(err)
			}
			got = m[channel]
		}
		if ok(got) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: subscriber count not as expected within 10s", channel)
}

// A waiter blocked in Acquire gets the lock as soon as the holder releases
// it: with a 30s lease, a grant that arrives before the lease could have run
// out was handed off by the release, not by expiry.
func TestAcquireWakesOnRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return testenv.StartRedisCluster(t).ClusterClient() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := tc.client(t)
			l := newLocker(t, c)
			t.Cleanup(l.Close)
			const ttl = 30 * time.Second
			holder := mustAcquire(t, l, "handoff", ttl)

			got := make(chan *lock.Lease, 1)
			errc := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx, "handoff", ttl)
				if err != nil {
					errc <- err
					return
				}
				got <- lease
			}()
			waitSubscribed(t, c, keysOf(l).ReleaseChannel("handoff"), 1)
			released := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case lease := <-got:
				t.Logf("hand-off %v after release", time.Since(released))
				if lease.Fence().Token <= holder.Fence().Token {
					t.Fatalf("token %d after %d", lease.Fence().Token, holder.Fence().Token)
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			case err := <-errc:
				t.Fatal(err)
			case <-time.After(ttl / 3):
				t.Fatalf("no hand-off within %v of release; the lease had %v left", ttl/3, ttl)
			}
		})
	}
}

// A holder that vanishes without releasing hands the lock on when its lease
// runs out, without a message.
func TestAcquireAfterHolderVanishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	gone := mustAcquire(t, l, "vanish", 300*time.Millisecond) // never released nor renewed
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(actx, "vanish", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("granted %v after the holder vanished", time.Since(start))
	if lease.Fence().Token <= gone.Fence().Token {
		t.Fatalf("token %d after %d", lease.Fence().Token, gone.Fence().Token)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A subscription that Redis cuts does not strand a waiter: it falls back to
// timed retries, never past the holder's remaining lease.
func TestAcquireSurvivesSubscriptionCut(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	holder := mustAcquire(t, l, "cut", 30*time.Second)
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "cut", time.Second)
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	waitSubscribed(t, srv.Client(), keysOf(l).ReleaseChannel("cut"), 1)
	proxy.CutAll()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of a release while its subscription was cut")
	}
}

// 16 goroutines contend for one resource, holding it for no time at all:
// every grant gets a new, higher token and no two leases overlap. Commands
// per grant are reported for pub/sub wake-ups and for polling.
func TestContentionZeroHold(t *testing.T) {
	for _, mode := range []string{"pubsub", "polling"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			srv := testenv.StartRedis(t)
			c := srv.Client()
			hook := &testenv.Commands{}
			c.AddHook(hook)
			var opts []lock.Option
			if mode == "polling" {
				opts = append(opts, lock.WithWait(lock.Backoff(time.Millisecond, 64*time.Millisecond)))
			}
			l := newLocker(t, c, opts...)
			t.Cleanup(l.Close)

			const workers, perWorker = 16, 40
			var (
				inside atomic.Int32
				mu     sync.Mutex
				tokens []fence.Token
				wg     sync.WaitGroup
			)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range perWorker {
						lease, err := l.Acquire(ctx, "hot", 5*time.Second)
						if err != nil {
							t.Error(err)
							return
						}
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d leases overlap", n)
						}
						mu.Lock()
						tokens = append(tokens, lease.Fence().Token)
						mu.Unlock()
						inside.Add(-1)
						if err := lease.Release(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if len(tokens) != workers*perWorker {
				t.Fatalf("%d grants, want %d", len(tokens), workers*perWorker)
			}
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Fatalf("grant %d got token %d after %d", i, tokens[i], tokens[i-1])
				}
			}
			cmds := hook.Take()
			subs := serverCalls(t, c, "subscribe", "unsubscribe", "ping")
			grants := float64(len(tokens))
			t.Logf("%s: %.2f client commands per grant (%d), plus %d subscribe/unsubscribe/ping on the subscription connection (%.3f per grant)",
				mode, float64(len(cmds))/grants, len(cmds), subs, float64(subs)/grants)
		})
	}
}

// serverCalls sums the server's call counts of the named commands.
func serverCalls(t testing.TB, c *redis.Client, names ...string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range names {
			prefix := "cmdstat_" + name + ":calls="
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				total += n
			}
		}
	}
	return total
}

// Close stops the shared subscription; a Locker keeps working after it,
// waiting by timed retries.
func TestCloseStopsSubscription(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	holder := mustAcquire(t, l, "closing", 300*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "closing", time.Second)
		if err == nil {
			err = lease.Release(ctx)
		}
		done <- err
	}()
	waitSubscribed(t, c, keysOf(l).ReleaseChannel("closing"), 1)
	l.Close()
	waitSubscribers(t, c, keysOf(l).ReleaseChannel("closing"), func(n int64) bool { return n == 0 })
	// The waiter gets the lock when the holder's lease runs out.
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an expired lease = %v, want ErrNotHeld", err)
	}
	if err := l.Do(ctx, "closing", time.Second, func(context.Context, fence.Fence) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// On a cluster each hash slot with waiters has a sharded subscription of
// its own; waiters on resources in different slots are all woken by their
// releases.
func TestAcquireWakesAcrossSlots(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	c := testenv.StartRedisCluster(t).ClusterClient()
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	const ttl = 30 * time.Second
	resources := []string{"a", "b", "c"} // three different slots
	holders := make([]*lock.Lease, len(resources))
	got := make(chan error, len(resources))
	for i, r := range resources {
		holders[i] = mustAcquire(t, l, r, ttl)
		go func() {
			lease, err := l.Acquire(ctx, r, ttl)
			if err == nil {
				err = lease.Release(ctx)
			}
			got <- err
		}()
	}
	for _, r := range resources {
		waitSubscribed(t, c, keysOf(l).ReleaseChannel(r), 1)
	}
	for _, h := range holders {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range resources {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(ttl / 3):
			t.Fatalf("a waiter was not woken within %v (the leases had %v)", ttl/3, ttl)
		}
	}
}

// A release wakes one of a Locker's waiters, not all of them: with 8
// waiters on a lock held for 30s, the release and the winner's try are the
// only scripts run until the winner lets go.
func TestReleaseWakesOneWaiter(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	hook := &testenv.Commands{}
	c.AddHook(hook)
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	const ttl = 30 * time.Second
	holder := mustAcquire(t, l, "herd", ttl)

	const waiters = 8
	won := make(chan *lock.Lease, waiters)
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if lease, err := l.Acquire(ctx, "herd", ttl); err == nil {
				won <- lease
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	// Every waiter tries once, and once more when the shared subscription is
	// confirmed; then, with 30s left on the lease, they all wait quietly.
	deadline := time.Now().Add(10 * time.Second)
	for last := -1; ; {
		n := hook.Len()
		if n >= waiters && n == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters still trying after 10s (%d commands)", n)
		}
		last = n
		time.Sleep(200 * time.Millisecond)
	}
	hook.Take()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var winner *lock.Lease
	select {
	case winner = <-won:
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter got the lock within 10s of the release")
	}
	// Give a herd time to show itself.
	time.Sleep(300 * time.Millisecond)
	// Only scripts count: a new pool connection's HELLO and CLIENT are no
	// herd.
	var scripts []string
	for _, c := range hook.Take() {
		if c == "evalsha" || c == "eval" {
			scripts = append(scripts, c)
		}
	}
	if len(scripts) > 3 {
		t.Fatalf("one release of %d waiters led to %d scripts; want the release and one try", waiters, len(scripts))
	}
	if err := winner.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Waiting works on a *redis.Ring of two shards, end to end: each waiter
// subscribes on its resource's shard, queues there, and is handed the lock
// by the release.
func TestAcquireWaitsOnARing(t *testing.T) {
	testenv.Slow(t)
	ctx := context.Background()
	a, b := testenv.StartRedis(t), testenv.StartRedis(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	l := newLocker(t, ring)
	t.Cleanup(l.Close)
	hl := newLocker(t, ring, lock.WithPrefix(strings.TrimSuffix(keysOf(l).LockKey("x"), "{x}:lock")))
	t.Cleanup(hl.Close)
	shards := map[string]bool{}
	for i := range 8 {
		resource := fmt.Sprintf("ring-%d", i)
		holder := mustAcquire(t, hl, resource, 30*time.Second)
		if a.Client().Exists(ctx, keysOf(l).LockKey(resource)).Val() == 1 {
			shards["a"] = true
		} else {
			shards["b"] = true
		}
		got := make(chan acquired, 1)
		startWaiter(ctx, l, "w", resource, 30*time.Second, got)
		waitQueued(t, ring, l, resource, 1)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w := receive(t, got, 5*time.Second)
		if w.lease.Fence().Token <= holder.Fence().Token {
			t.Fatalf("%s: waiter's token %d after %d", resource, w.lease.Fence().Token, holder.Fence().Token)
		}
		wantHolder(t, ring, l, resource, w.lease.Fence().Holder)
		if err := w.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(shards) != 2 {
		t.Fatalf("the resources all landed on shard %v; want both used", shards)
	}
}
