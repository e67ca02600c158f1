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

// TestOnClusters runs the single-node tests that matter most on a cluster
// (grants and tokens, one slot per resource, wake-ups by sharded pub/sub,
// Do, Extend and Owner) against a one-node cluster and against three
// masters with a replica each, where a resource's keys must stay on one
// master and waiters on every master must be woken.
func TestOnClusters(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) *redis.ClusterClient
	}{
		{"one node", func(t *testing.T) *redis.ClusterClient { return testenv.StartRedisCluster(t).ClusterClient() }},
		{"three masters with replicas", func(t *testing.T) *redis.ClusterClient { return testenv.StartCluster(t, 3, 1).Client() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			l, err := lock.New(c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			t.Run("tokens and slots", func(t *testing.T) { clusterTokensAndSlots(t, c, l) })
			t.Run("wake-ups on every master", func(t *testing.T) { clusterWakeUps(t, c, l) })
			t.Run("release announces on the sharded channel", func(t *testing.T) { clusterReleaseAnnounces(t, c, l) })
			t.Run("do, extend and owner", func(t *testing.T) { clusterLeaseOps(t, l) })
		})
	}
}

// clusterResources returns resources whose keys spread over every master.
func clusterResources(t *testing.T, c *redis.ClusterClient, l *lock.Locker) []string {
	t.Helper()
	ctx := context.Background()
	masterOf, err := testenv.SlotMasters(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for slot := int64(0); slot < 16384; slot++ {
		m := masterOf(slot)
		if m == "" {
			t.Fatalf("slot %d has no master", slot)
		}
		masters[m] = true
	}
	seen := map[string]bool{}
	var out []string
	for i := 0; len(out) < 6; i++ {
		r := fmt.Sprintf("acct-%d", i)
		slot, err := c.ClusterKeySlot(ctx, keysOf(l).LockKey(r)).Result()
		if err != nil {
			t.Fatal(err)
		}
		m := masterOf(slot)
		if !seen[m] || len(seen) == len(masters) {
			seen[m] = true
			out = append(out, r)
		}
	}
	return out
}

func clusterTokensAndSlots(t *testing.T, c *redis.ClusterClient, l *lock.Locker) {
	ctx := context.Background()
	for _, r := range clusterResources(t, c, l) {
		want := c.ClusterKeySlot(ctx, keysOf(l).LockKey(r)).Val()
		for _, k := range []string{keysOf(l).TokenKey(r), keysOf(l).ReleaseChannel(r), keysOf(l).LockKey(r) + "x"} {
			if got := c.ClusterKeySlot(ctx, k).Val(); got != want {
				t.Fatalf("%q in slot %d, the lock key of %q in %d", k, got, r, want)
			}
		}
		var last fence.Token
		for range 20 {
			lease := mustAcquire(t, l, r, time.Second)
			if lease.Fence().Token <= last {
				t.Fatalf("%s: token %d after %d", r, lease.Fence().Token, last)
			}
			last = lease.Fence().Token
			if _, err := l.TryAcquire(ctx, r, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("%s: second TryAcquire while held: %v", r, err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// clusterWakeUps holds a long lease on resources on every master, waits
// for waiters to subscribe on each (SSUBSCRIBE, in each resource's slot),
// then releases: every waiter must get its lock long before the leases
// could have run out.
func clusterWakeUps(t *testing.T, c *redis.ClusterClient, l *lock.Locker) {
	ctx := context.Background()
	const ttl = 30 * time.Second
	rs := clusterResources(t, c, l)
	holders := make([]*lock.Lease, len(rs))
	for i, r := range rs {
		holders[i] = mustAcquire(t, l, r, ttl)
	}
	got := make(chan error, len(rs))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, r := range rs {
		go func() {
			lease, err := l.Acquire(wctx, r, time.Second)
			if err == nil {
				err = lease.Release(ctx)
			}
			got <- err
		}()
	}
	for _, r := range rs {
		waitSubscribed(t, c, keysOf(l).ReleaseChannel(r), 1)
	}
	for _, h := range holders {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range rs {
		if err := <-got; err != nil {
			t.Fatalf("a waiter was not woken by the release: %v", err)
		}
	}
}

func clusterLeaseOps(t *testing.T, l *lock.Locker) {
	ctx := context.Background()
	err := l.Do(ctx, "do", time.Second, func(ctx context.Context, f fence.Fence) error {
		if f.Resource != "do" || f.Token < 1 {
			return fmt.Errorf("fence %v", f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lease := mustAcquire(t, l, "extend", time.Second)
	if err := lease.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := lease.TTL(ctx); err != nil || d < 9*time.Second {
		t.Fatalf("TTL after Extend = %v, %v", d, err)
	}
	a, err := l.TryAcquire(ctx, "owned", time.Second, lock.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, "owned", time.Second, lock.Owner("job"))
	if err != nil || b.Fence() != a.Fence() {
		t.Fatalf("re-entry = %v, %v; want the same fence %v", b, err, a.Fence())
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "owned", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("acquired while a hold remains: %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// clusterReleaseAnnounces: a release that finds only a lapsed waiter
// queued announces on the resource's sharded channel (SPUBLISH, on the
// channel release.lua makes from the lock key), on every master.
func clusterReleaseAnnounces(t *testing.T, c *redis.ClusterClient, l *lock.Locker) {
	ctx := context.Background()
	for _, r := range clusterResources(t, c, l) {
		ps := c.SSubscribe(ctx, keysOf(l).ReleaseChannel(r))
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatalf("%s: subscribe: %v", r, err)
		}
		lease := mustAcquire(t, l, r, time.Minute)
		queueLapsed(t, c, l, r, "gone")
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msg, err := ps.ReceiveMessage(rctx)
		cancel()
		_ = ps.Close()
		if err != nil {
			t.Fatalf("%s: no announcement on %q: %v", r, keysOf(l).ReleaseChannel(r), err)
		}
		if msg.Payload != "" {
			t.Fatalf("%s: the release announced %q, want the empty message", r, msg.Payload)
		}
	}
}
