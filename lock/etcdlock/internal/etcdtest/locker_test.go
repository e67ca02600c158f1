package etcdtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

var etcdlockNew = etcdlock.New

func newLocker(t testing.TB, c *Cluster) *lock.Locker {
	t.Helper()
	l, err := etcdlock.New(c.Client(t), lock.WithPrefix("fk-"+fence.NewHolder()[:8]+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// TestLockerOnEtcd checks etcdlock.New's Locker end to end: a grant's
// fence carries an etcd token, a second holder is refused while it is
// held, and a released lock is granted again with a higher token.
func TestLockerOnEtcd(t *testing.T) {
	c := sharedCluster(t)
	l := newLocker(t, c)
	ctx := ctxFor(t, 30*time.Second)
	a, err := l.TryAcquire(ctx, "job", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.Fence().Token <= etcdlock.TokenBase {
		t.Fatalf("token %d is not an etcd token", a.Fence().Token)
	}
	if _, err := l.TryAcquire(ctx, "job", 5*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held: %v, want ErrNotAcquired", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, "job", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if b.Fence().Token <= a.Fence().Token {
		t.Fatalf("token %d after %d", b.Fence().Token, a.Fence().Token)
	}
}

// TestLockerAcquireQueuesOnEtcd runs 8 Acquires against one held lock:
// each is handed the lock in turn, tokens increase, and no two hold it at
// once.
func TestLockerAcquireQueuesOnEtcd(t *testing.T) {
	c := sharedCluster(t)
	l := newLocker(t, c)
	ctx := ctxFor(t, time.Minute)
	first, err := l.TryAcquire(ctx, "q", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var tokens []fence.Token
	holding := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			s, err := l.Acquire(ctx, "q", 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			holding++
			if holding > 1 {
				t.Error("two holders at once")
			}
			tokens = append(tokens, s.Fence().Token)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			holding--
			mu.Unlock()
			if err := s.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // the waiters queue
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(tokens) != 8 {
		t.Fatalf("%d of 8 acquired", len(tokens))
	}
	last := first.Fence().Token
	for i, tok := range tokens {
		if tok <= last {
			t.Fatalf("grant %d: token %d after %d", i, tok, last)
		}
		last = tok
	}
}

// TestLockerLeaseDoneBeforeServerExpiry checks a Lease left alone (a
// paused holder): Done closes before the server expired the lease and
// another holder was granted.
func TestLockerLeaseDoneBeforeServerExpiry(t *testing.T) {
	c := sharedCluster(t)
	l := newLocker(t, c)
	ctx := ctxFor(t, 30*time.Second)
	a, err := l.TryAcquire(ctx, "d", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	doneAt := make(chan time.Time, 1)
	go func() { <-a.Done(); doneAt <- time.Now() }()
	b, err := l.Acquire(ctx, "d", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	var done time.Time
	select {
	case done = <-doneAt:
	default:
	}
	if done.IsZero() || !done.Before(granted) {
		t.Fatalf("the first lease's Done closed at %v, not before the next grant at %v", done, granted)
	}
	if b.Fence().Token <= a.Fence().Token {
		t.Fatalf("token %d after %d", b.Fence().Token, a.Fence().Token)
	}
}

// TestNewRefusesBadInput checks that etcdlock.New refuses a nil client and
// options that mean nothing on etcd, as invalid arguments.
func TestNewRefusesBadInput(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	if _, err := etcdlock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil): %v", err)
	}
	if _, err := etcdlock.New(cli, lock.WithTokenRetention(time.Hour)); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New with WithTokenRetention: %v", err)
	}
	l, err := etcdlock.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.TryAcquire(context.Background(), "x", 0); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("TryAcquire with ttl 0: %v", err)
	}
}
