package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// The deadline tests' figures: a 300 ms context, and a margin for a loaded
// machine (a goroutine woken 353 ms late was seen at -p 4 beside the
// checkers). go-redis's default read timeout (5 s), which calls used to
// wait for, is far beyond both, as is Close's 4.7 s while a subscription
// was made again.
const (
	silentTimeout = 300 * time.Millisecond
	silentMargin  = time.Second
	// closeBound is what Close may take with a silent server: the cleanup
	// bound (2 s) and the margin.
	closeBound = 2*time.Second + silentMargin
)

// silentClient returns a client made with go-redis's default options
// (ContextTimeoutEnabled off, a 5 s read timeout, 3 retries), as most
// users make it, that reaches the shared Redis through a proxy the test can
// black-hole.
func silentClient(t *testing.T) (*redis.Client, *testenv.Proxy) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: opt.DB})
	t.Cleanup(func() { _ = c.Close() })
	return c, proxy
}

// returnsBy runs call with a silentTimeout context and fails t unless it
// returns an error matching the context's within silentTimeout+silentMargin.
func returnsBy(t *testing.T, name string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), silentTimeout)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	took := time.Since(start)
	t.Logf("%s with a %v context and Redis silent: %v (%v)", name, silentTimeout, took.Round(time.Millisecond), err)
	switch {
	case err == nil:
		t.Errorf("%s succeeded with Redis silent", name)
	case !errors.Is(err, context.DeadlineExceeded):
		t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", name, err)
	}
	if took > silentTimeout+silentMargin {
		t.Errorf("%s returned after %v, past its %v deadline", name, took.Round(time.Millisecond), silentTimeout)
	}
}

// With a client made with default options (go-redis then ignores context
// deadlines and waits for its read timeout), every call returns by its
// context's deadline when Redis accepted the command and went silent, and
// Close returns within the cleanup bound. Once Redis answers again, no lock
// is left behind by the calls cut short.
func TestCallsReturnByTheDeadlineWithDefaultClientOptions(t *testing.T) {
	testenv.Slow(t)
	c, proxy := silentClient(t)
	l := newLocker(t, c)
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	// Held leases to extend, ask about and release once Redis is silent;
	// their grants load the scripts.
	held := make([]*lock.Lease, 3)
	for i := range held {
		held[i] = mustAcquire(t, l, "held"+string(rune('a'+i)), 10*time.Second)
	}
	if _, err := l.FenceLock(context.Background(), "foreign-warm", "v"); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("FenceLock of a free key = %v", err)
	}
	if err := l.Advance(context.Background(), "warm", 1); err != nil {
		t.Fatal(err)
	}

	returnsBy(t, "Do", func(ctx context.Context) error {
		return l.Do(ctx, "silent-do", 10*time.Second, func(fctx context.Context, _ fence.Fence) error {
			proxy.Block()
			<-fctx.Done()
			return fctx.Err()
		})
	})
	returnsBy(t, "TryAcquire", func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "silent-try", 10*time.Second)
		return err
	})
	returnsBy(t, "TryAcquire with an owner", func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "silent-owner", 10*time.Second, lock.Owner("o"))
		return err
	})
	returnsBy(t, "Acquire", func(ctx context.Context) error {
		_, err := l.Acquire(ctx, "silent-acquire", 10*time.Second)
		return err
	})
	returnsBy(t, "FenceLock", func(ctx context.Context) error {
		_, err := l.FenceLock(ctx, "foreign", "value")
		return err
	})
	returnsBy(t, "Advance", func(ctx context.Context) error {
		return l.Advance(ctx, "silent-advance", 5)
	})
	returnsBy(t, "Extend", func(ctx context.Context) error { return held[0].Extend(ctx, 20*time.Second) })
	returnsBy(t, "TTL", func(ctx context.Context) error {
		_, err := held[1].TTL(ctx)
		return err
	})
	returnsBy(t, "Release", held[2].Release)

	start := time.Now()
	l.Close()
	closed = true
	took := time.Since(start)
	t.Logf("Close took %v with Redis silent", took.Round(time.Millisecond))
	if took > closeBound {
		t.Errorf("Close took %v with Redis silent, past the %v cleanup bound", took.Round(time.Millisecond), closeBound-silentMargin)
	}
}

// A call cut short at its deadline leaves no lock behind: the grant that
// reaches Redis after the caller gave up is released once Redis answers,
// and the next caller gets the lock at once.
func TestACutShortAcquisitionLeavesNoLock(t *testing.T) {
	testenv.Slow(t)
	c, proxy := silentClient(t)
	l := newLocker(t, c)
	direct := testenv.Redis(t)
	warm := mustAcquire(t, l, "cut", time.Minute) // loads the scripts
	if err := warm.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"TryAcquire", "Acquire"} {
		proxy.Block()
		ctx, cancel := context.WithTimeout(context.Background(), silentTimeout)
		var err error
		if name == "TryAcquire" {
			_, err = l.TryAcquire(ctx, "cut", time.Minute)
		} else {
			_, err = l.Acquire(ctx, "cut", time.Minute)
		}
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s with Redis silent = %v, want context.DeadlineExceeded", name, err)
		}
		proxy.Unblock() // the grant reaches Redis now, after the caller gave up
		// Whatever reached Redis is released by the cleanup, well inside
		// its bound. The key may still be absent for a moment because the
		// late grant has not reached Redis yet: a try that meets it held
		// tries again, up to the bound.
		deadline := time.Now().Add(3 * time.Second)
		for {
			lease, err := l.TryAcquire(context.Background(), "cut", time.Minute)
			if err == nil {
				if err := lease.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				break
			}
			if !errors.Is(err, lock.ErrNotAcquired) || time.Now().After(deadline) {
				t.Fatalf("after %s cut short: %v (Redis holds the lock for %v)", name, err, direct.PTTL(context.Background(), keysOf(l).LockKey("cut")).Val())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Close on a Redlock Locker with one node silent (default client options)
// returns within the cleanup bound, although the call to that node and the
// release that follows it are stuck in the client for its read timeout.
func TestRedlockCloseWithASilentNode(t *testing.T) {
	testenv.Slow(t)
	var clients []redis.UniversalClient
	var proxy *testenv.Proxy
	for i := range 3 {
		addr := testenv.StartRedis(t).Addr()
		if i == 2 {
			proxy = testenv.StartProxy(t, addr)
			addr = proxy.Addr()
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	// A node timeout far below the client's read timeout, and long enough
	// for a loaded machine.
	l, err := lock.NewRedlock(clients, lock.WithPrefix(testenv.Prefix(t)), lock.WithNodeTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; ; i++ { // loads the scripts everywhere
		warm, err := l.TryAcquire(ctx, "redlock-silent", time.Minute)
		if err == nil {
			if err := warm.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if i == 5 {
			t.Fatal(err)
		}
	}
	proxy.Block()
	lease, err := l.TryAcquire(ctx, "redlock-silent", time.Minute)
	if err != nil {
		t.Fatalf("two of three nodes answer: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("two of three nodes answer: %v", err)
	}
	start := time.Now()
	l.Close()
	took := time.Since(start)
	t.Logf("Redlock Close took %v with a node silent", took.Round(time.Millisecond))
	if took > closeBound {
		t.Errorf("Redlock Close took %v with a node silent, past the %v cleanup bound", took.Round(time.Millisecond), closeBound-silentMargin)
	}
}

// A context without a deadline has no deadline to keep: its calls go
// straight to the client, whatever the client's options, at the cost of an
// uncontended acquire and release with context.Background. A goroutine per
// call (twelve allocations more a pair, and a thread woken on every call,
// which made the uncontended pair 1.3x redislock in the performance report)
// would buy only an early return on cancellation, which go-redis gives no
// other call either.
func TestNoDeadlineCallsGoStraightToTheClient(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Default options but for where the server is.
	c := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Username: opt.Username, Password: opt.Password})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	t.Cleanup(l.Close)
	pair := func(ctx context.Context) func() {
		return func() {
			lease, err := l.TryAcquire(ctx, "straight", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	pair(context.Background())() // loads the scripts
	background := testing.AllocsPerRun(50, pair(context.Background()))
	cancelOnly, cancel := context.WithCancel(context.Background())
	defer cancel()
	withCancel := testing.AllocsPerRun(50, pair(cancelOnly))
	if withCancel > background+2 {
		t.Fatalf("acquire and release with a cancellable context without deadline: %.0f allocations, with context.Background %.0f: the calls went through a goroutine", withCancel, background)
	}
}

// Close returns within its cleanup bound while a waiter's subscription is
// being made again on a silent server: the subscription connection breaks
// while Redis is silent, and its replacement's dial and handshake hold the
// subscription (and everything that would close it) until the client's read
// timeout. With default client options and with ContextTimeoutEnabled alike.
func TestCloseReturnsWhileTheSubscriptionReconnects(t *testing.T) {
	testenv.Slow(t)
	for _, contextTimeout := range []bool{false, true} {
		name := "default"
		if contextTimeout {
			name = "context_timeout"
		}
		t.Run(name, func(t *testing.T) {
			opt, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy := testenv.StartProxy(t, opt.Addr)
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: opt.DB, ContextTimeoutEnabled: contextTimeout})
			t.Cleanup(func() { _ = c.Close() })
			prefix := lock.WithPrefix(testenv.Prefix(t))
			l, err := lock.New(c, prefix)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					l.Close()
				}
			})
			direct := testenv.Redis(t)
			other, err := lock.New(direct, prefix)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(other.Close)
			held := mustAcquire(t, other, "resub", time.Minute)
			t.Cleanup(func() { _ = held.Release(context.Background()) })

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx, "resub", time.Minute)
				done <- err
			}()
			waitSubscribers(t, direct, keysOf(l).ReleaseChannel("resub"), func(n int64) bool { return n == 1 })
			// Silent, and the subscription's connection broken: the hub
			// subscribes again on a new connection, whose handshake gets
			// no answer.
			proxy.Block()
			proxy.CutAll()
			time.Sleep(300 * time.Millisecond)

			start := time.Now()
			l.Close()
			closed = true
			took := time.Since(start)
			t.Logf("Close took %v while the subscription was made again on a silent server", took.Round(time.Millisecond))
			if took > closeBound {
				t.Errorf("Close took %v, past the %v cleanup bound", took.Round(time.Millisecond), closeBound-silentMargin)
			}
			cancel()
			proxy.Unblock()
			<-done
		})
	}
}
