package rueidisfence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// rueidisClient returns a rueidis client of addr, closed when t ends.
func rueidisClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// sharedAddr is the address of the shared Redis server.
func sharedAddr(t testing.TB) string {
	t.Helper()
	return testenv.Redis(t).Options().Addr
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNilClients(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil) = %v, want fence.ErrInvalid", err)
	}
	if _, err := NewRedlock(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("NewRedlock(nil) = %v, want fence.ErrInvalid", err)
	}
	c := rueidisClient(t, sharedAddr(t))
	if _, err := NewRedlock([]rueidis.Client{c, nil}); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("NewRedlock with a nil client = %v, want fence.ErrInvalid", err)
	}
	if _, err := NewRedlock([]rueidis.Client{c, c}); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("NewRedlock with one client twice = %v, want fence.ErrInvalid", err)
	}
	if _, err := New(c, lock.WithNodeTimeout(time.Second)); err == nil {
		t.Error("New accepted WithNodeTimeout, an option of Redlock's")
	}
}

// TestSameLockAsGoRedis locks one resource through a go-redis Locker and a
// rueidis Locker with the same prefix: they exclude each other, their
// tokens rise across both, and a waiter on one is handed the lock by a
// release on the other.
func TestSameLockAsGoRedis(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	prefix := testenv.Prefix(t)
	gl, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	rl, err := New(rueidisClient(t, sharedAddr(t)), lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()

	var last fence.Token
	for i, l := range []*lock.Locker{gl, rl, rl, gl, rl} {
		lease, err := l.TryAcquire(ctx, "r", time.Second)
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if tok := lease.Fence().Token; tok <= last {
			t.Fatalf("grant %d: token %d after %d", i, tok, last)
		} else {
			last = tok
		}
		other := gl
		if l == gl {
			other = rl
		}
		if _, err := other.TryAcquire(ctx, "r", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("grant %d: the other client's TryAcquire = %v, want ErrNotAcquired", i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Hand-over: a rueidis waiter queued behind a go-redis holder, and
	// the other way round; each is granted by the release, well before the
	// holder's long lease would end.
	for _, pair := range [][2]*lock.Locker{{gl, rl}, {rl, gl}} {
		holder, waiter := pair[0], pair[1]
		lease, err := holder.TryAcquire(ctx, "h", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lock.Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "h", time.Second)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitQueued(t, ctx, holder, "h")
		start := time.Now()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next := <-got
		if next == nil {
			t.FailNow()
		}
		if next.Fence().Token <= lease.Fence().Token {
			t.Errorf("hand-over token %d after %d", next.Fence().Token, lease.Fence().Token)
		}
		t.Logf("handed over %v after the release", time.Since(start).Round(time.Microsecond))
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueued waits until resource's queue has a waiter.
func waitQueued(t *testing.T, ctx context.Context, l *lock.Locker, resource string) {
	t.Helper()
	var n lock.RedisNames
	if !l.As(&n) {
		t.Fatal("not a Redis Locker")
	}
	queue := n.LockKey(resource)
	queue = queue[:len(queue)-len(":lock")] + ":queue"
	rc := testenv.Redis(t)
	for rc.ZCard(ctx, queue).Val() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no waiter queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClusterQueueAndElection runs a queue with hand-overs and an
// election on a Redis Cluster through a rueidis cluster client: waiters
// subscribe with SSUBSCRIBE on a dedicated connection of the slot.
func TestClusterQueueAndElection(t *testing.T) {
	srv := testenv.StartRedisCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ShuffleInit: false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %v, want a cluster client", c.Mode())
	}
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const waiters = 4
	tokens := make(chan fence.Token, waiters+1)
	first, err := l.TryAcquire(ctx, "q", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tokens <- first.Fence().Token
	done := make(chan struct{})
	for range waiters {
		go func() {
			defer func() { done <- struct{}{} }()
			lease, err := l.Acquire(ctx, "q", 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			tokens <- lease.Fence().Token
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		<-done
	}
	// Four hand-overs, each in the release: far below one lease (10s).
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("four hand-overs took %v: the waiters were not woken by the releases", d)
	}
	close(tokens)
	seen := map[fence.Token]bool{}
	for tok := range tokens {
		if seen[tok] {
			t.Errorf("token %d granted twice", tok)
		}
		seen[tok] = true
	}

	e, err := election.New(l, "leader", election.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	term, err := e.Campaign(ctx, "me")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ld, err := e.Leader(ctx)
		if err == nil && ld.Value == "me" && ld.Token == term.Fence().Token {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Leader = %+v, %v; want me at %d", ld, err, term.Fence().Token)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
