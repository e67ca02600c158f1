package integration_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestRedlockCloseWaitsForNodeCalls: a Redlock acquisition returns once a
// quorum answered, leaving the call to a node behind a stalled network in
// flight (and, when it fails, the release that cleans up after it). Close
// waits for those goroutines, so none is left the moment it returns.
func TestRedlockCloseWaitsForNodeCalls(t *testing.T) {
	ctx := context.Background()
	var (
		clients []redis.UniversalClient
		proxy   *testenv.Proxy
	)
	for i := range 3 {
		addr := testenv.StartRedis(t).Addr()
		if i == 2 {
			proxy = testenv.StartProxy(t, addr)
			addr = proxy.Addr()
		}
		c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Ping(ctx).Err(); err != nil { // the client's own connections come first
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	before := goleak.IgnoreCurrent()
	l, err := lock.NewRedlock(clients, lock.WithPrefix(testenv.Prefix(t)), lock.WithNodeTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	lease, err := l.TryAcquire(ctx, "leak-redlock", 10*time.Second)
	if err != nil {
		t.Fatalf("two of three nodes answer: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l.Close()
	t.Logf("Close waited %v for the stalled node's calls", time.Since(start))
	// Looked for within 50 ms, well inside the stalled call's 300 ms read
	// timeout (goleak's retries would outwait it): a call Close waited for
	// may still be returning from its last line when Close returns.
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(50 * time.Millisecond); ; time.Sleep(5 * time.Millisecond) {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "lock.fanOut") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node call is still running 50 ms after Close:\n%s", stacks)
		}
	}
	proxy.Unblock()
	goleak.VerifyNone(t, before)
}
