package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestCallsCutShortLeaveNoGoroutines: with a client made with default
// options (which ignores context deadlines) and Redis silent, calls return
// at their deadline and leave their command running in the background.
// Those goroutines end with the client's read timeout or when the client is
// closed: once the Locker and the client are closed, none is left, and no
// goroutine of the store either.
func TestCallsCutShortLeaveNoGoroutines(t *testing.T) {
	testenv.Slow(t)
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: opt.DB})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil { // the client's own connections come first
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	l := newLocker(t, c)
	s, err := fkredis.New(c, fkredis.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.TryAcquire(ctx, "leak-cut", time.Minute, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	cut := func(name string, call func(ctx context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := call(cctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with Redis silent = %v, want context.DeadlineExceeded", name, err)
		}
	}
	cut("TryAcquire", func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "leak-cut-try", time.Minute)
		return err
	})
	cut("Extend", func(ctx context.Context) error { return held.Extend(ctx, time.Minute) })
	cut("Set", func(ctx context.Context) error {
		_, err := s.FencedSet(ctx, fence.Fence{Resource: "leak-cut", Token: 1, Holder: "h"}, "k", []byte("v"))
		return err
	})
	cut("Release", held.Release)
	start := time.Now()
	l.Close()
	t.Logf("Close took %v with Redis silent", time.Since(start).Round(time.Millisecond))
	// The commands cut short are still in the client, waiting for its 5 s
	// read timeout; closing the client ends them.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	proxy.CutAll()
	goleak.VerifyNone(t, before)
}
