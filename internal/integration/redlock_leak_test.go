package integration_test

import (
	"context"
	"errors"
	"fmt"
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
	l, err := lock.NewRedlock(clients, lock.WithPrefix(testenv.Prefix(t)), lock.WithNodeTimeout(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	// The node timeout is well inside the stalled node's 300 ms read
	// timeout, so its call is still in flight when the quorum answers, and
	// wide enough that a loaded machine's live nodes answer within it (20 ms
	// was not, once, in CI). A quorum missed all the same is tried again.
	var lease *lock.Lease
	for try := 1; ; try++ {
		lease, err = l.TryAcquire(ctx, fmt.Sprintf("leak-redlock-%d", try), 10*time.Second)
		if err == nil {
			break
		}
		if try == 3 || !errors.Is(err, lock.ErrNoQuorum) {
			t.Fatalf("two of three nodes answer: %v", err)
		}
		t.Logf("try %d: %v", try, err)
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
