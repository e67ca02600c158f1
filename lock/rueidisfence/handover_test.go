package rueidisfence

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestHandOverCostsTheWaiterNoCommand queues a waiter behind a long lease
// and releases it: the release hands the lock over, and the waiter learns
// of it from the release's message alone, sending no command between the
// release and its grant (a waiter that missed the message would find out
// at its next queue refresh, by a script call).
func TestHandOverCostsTheWaiterNoCommand(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	prefix := testenv.Prefix(t)
	hl, err := New(rueidisClient(t, sharedAddr(t)), lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	var calls atomic.Int64
	wc := newClient(rueidisClient(t, sharedAddr(t)))
	wc.before = func(string, []string, []string) { calls.Add(1) }
	wl, err := newOn(wc, []lock.Option{lock.WithPrefix(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	for round := range 3 {
		holder, err := hl.TryAcquire(ctx, "handover", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lock.Lease, 1)
		go func() {
			l, err := wl.Acquire(ctx, "handover", 30*time.Second)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitQueued(t, ctx, hl, "handover")
		// Right after a queue refresh, so that the next is a second away.
		time.Sleep(50 * time.Millisecond)
		before := calls.Load()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := <-got
		if lease == nil {
			t.FailNow()
		}
		if n := calls.Load() - before; n != 0 {
			t.Fatalf("round %d: the waiter sent %d script calls between the release and its grant; want none (it learns of the hand-over from the release's message)", round, n)
		}
		if lease.Fence().Token <= holder.Fence().Token {
			t.Fatalf("hand-over token %d after %d", lease.Fence().Token, holder.Fence().Token)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
