package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/redis/go-redis/v9"
)

// With Redis down, every call returns by its context's deadline (plus
// scheduling slack): cleanup that must outlive the call (the release after
// an ambiguous grant, the release after Do's function) runs in the
// background, and Close waits for it.
//
// What is measured is each call's own overrun: how long after its deadline
// it returned, or, for Do, after the later of its deadline and the return
// of its function (which kills the server, and on a loaded machine may
// itself end past the deadline). Time spent before the deadline (dials,
// a slow start) is the context's to bound, not a lateness.
func TestCallsReturnByTheDeadlineWhenRedisIsDown(t *testing.T) {
	const (
		timeout = 500 * time.Millisecond
		// Slack for a loaded machine (a goroutine woken late); the cleanup
		// the calls used to wait for took seconds.
		slack = 300 * time.Millisecond
	)
	srv := testenv.StartRedis(t)
	c := srv.Client()
	l := newLocker(t, c)
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	// fnDone is when Do's function returned, if it did.
	var fnDone time.Time
	within := func(name string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		deadline, _ := ctx.Deadline()
		start := time.Now()
		fnDone = time.Time{}
		err := call(ctx)
		end := time.Now()
		if fnDone.After(deadline) {
			deadline = fnDone
		}
		over := end.Sub(deadline)
		t.Logf("%s with a %v context and Redis down: returned after %v, %v past its deadline (%v)",
			name, timeout, end.Sub(start).Round(time.Millisecond), max(over, 0).Round(time.Millisecond), err)
		if err == nil {
			t.Fatalf("%s succeeded with Redis down", name)
		}
		if over > slack {
			t.Errorf("%s returned %v past its %v deadline", name, over, timeout)
		}
	}

	// Do's function outlives the server and returns when its context ends.
	within("Do", func(ctx context.Context) error {
		return l.Do(ctx, "down", 10*time.Second, func(fctx context.Context, _ fence.Fence) error {
			srv.Kill()
			<-fctx.Done()
			fnDone = time.Now()
			return fctx.Err()
		})
	})
	within("TryAcquire", func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "down", time.Second)
		return err
	})
	within("Acquire", func(ctx context.Context) error {
		_, err := l.Acquire(ctx, "down", time.Second)
		return err
	})
	within("FenceLock", func(ctx context.Context) error {
		_, err := l.FenceLock(ctx, "foreign", "value")
		return err
	})
	start := time.Now()
	l.Close()
	closed = true
	t.Logf("Close waited %v for the background cleanup", time.Since(start).Round(time.Millisecond))
}

// A cleanup left to the background is done when Close returns: a grant
// whose reply was lost as the caller's context ended is released.
func TestCloseWaitsForBackgroundCleanup(t *testing.T) {
	testenv.Slow(t)
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	warm := mustAcquire(t, l, "bg", time.Minute) // loads the script
	if err := warm.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &loseReply{cancel: cancel}
	c.AddHook(h)
	h.armed.Store(true)
	if _, err := l.TryAcquire(ctx, "bg", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with lost reply = %v, want context.Canceled", err)
	}
	l.Close()
	if n := c.Exists(context.Background(), keysOf(l).LockKey("bg")).Val(); n != 0 {
		t.Fatal("the lost grant was still held after Close")
	}
}

// With a client whose ContextTimeoutEnabled is set, calls also return by
// their deadline when Redis accepted the connection and then went silent
// (a network black hole), Release included, and Close returns once the
// background cleanup has timed out.
func TestCallsReturnByTheDeadlineWhenRedisIsSilent(t *testing.T) {
	testenv.Slow(t)
	const (
		timeout = 500 * time.Millisecond
		slack   = 250 * time.Millisecond
	)
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	opt.Addr, opt.ContextTimeoutEnabled = proxy.Addr(), true
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	held := mustAcquire(t, l, "silent-held", 10*time.Second) // loads the scripts
	within := func(name string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		t.Logf("%s with a %v context and Redis silent: %v (%v)", name, timeout, took.Round(time.Millisecond), err)
		if err == nil {
			t.Fatalf("%s succeeded with Redis silent", name)
		}
		if took > timeout+slack {
			t.Errorf("%s returned after %v, past its %v deadline", name, took, timeout)
		}
	}
	within("Do", func(ctx context.Context) error {
		return l.Do(ctx, "silent", 10*time.Second, func(fctx context.Context, _ fence.Fence) error {
			proxy.Block()
			<-fctx.Done()
			return fctx.Err()
		})
	})
	within("TryAcquire", func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "silent", time.Second)
		return err
	})
	within("Acquire", func(ctx context.Context) error {
		_, err := l.Acquire(ctx, "silent", time.Second)
		return err
	})
	within("FenceLock", func(ctx context.Context) error {
		_, err := l.FenceLock(ctx, "foreign", "value")
		return err
	})
	within("Release", held.Release)
	start := time.Now()
	l.Close()
	closed = true
	took := time.Since(start)
	t.Logf("Close waited %v for the background cleanup", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("Close took %v: background cleanup is not bounded", took)
	}
	proxy.Unblock()
}
