package election_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestObserveAcrossDataLoss runs three candidates through Run on a private
// Redis that is flushed and then restarted empty in the middle: terms go on,
// their tokens keep increasing (they are anchored to the server's clock),
// and an observer sees every term in order.
func TestObserveAcrossDataLoss(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	oc := client()
	o := observe(ctx, t, oc, newElection(t, newLocker(t, oc, "el:"), "loss"))

	var mu sync.Mutex
	var won []election.Leader
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(won) }
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		e := newElection(t, newLocker(t, client(), "el:"), "loss")
		wg.Go(func() {
			err := election.Run(ctx, e, name, func(ctx context.Context, f fence.Fence) error {
				mu.Lock()
				won = append(won, election.Leader{Value: name, Token: f.Token})
				mu.Unlock()
				// Long enough for the observer's reads to find the term
				// while its subscription reconnects.
				select {
				case <-ctx.Done():
				case <-time.After(testTTL / 2):
				}
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run(%s) = %v", name, err)
			}
		})
	}
	waitTerms := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); count() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d terms after 20s, want %d", count(), n)
			}
		}
	}
	waitTerms(3)
	srv.Flush()
	waitTerms(count() + 3)
	srv.Kill()
	time.Sleep(50 * time.Millisecond)
	srv.Restart()
	waitTerms(count() + 3)
	mu.Lock()
	final := append([]election.Leader(nil), won...)
	mu.Unlock()
	seen := o.waitFor(t, final[len(final)-1].Token)
	cancel()
	wg.Wait()
	<-o.done
	// Terms are won one after another (across the flush, one may start
	// before the one whose lock was lost noticed it; their tokens still
	// order them), and each got a higher token than the last.
	for i := 1; i < len(final); i++ {
		if final[i].Token <= final[i-1].Token {
			t.Fatalf("term %d got token %d after %d", i, final[i].Token, final[i-1].Token)
		}
	}
	last := final[len(final)-1].Token
	for len(seen) > 0 && seen[len(seen)-1].Token > last {
		seen = seen[:len(seen)-1] // terms won after the snapshot
	}
	checkObserved(t, final, seen)
}

// TestCrashedLeaderReplaced stops a leader's renewals without a release
// (its Locker is closed, as a crash would leave it) and checks that a
// queued candidate is elected within the TTL plus the queue's bound.
func TestCrashedLeaderReplaced(t *testing.T) {
	testenv.Slow(t)
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	la := newLocker(t, c, prefix)
	a := mustCampaign(t, newElection(t, la, "crash"), "a")
	bc := campaignAsync(context.Background(), newElection(t, newLocker(t, c, prefix), "crash"), "b")
	waitQueued(t, c, la, "crash", 1)
	crashed := time.Now()
	la.Close()
	o := <-bc
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.term.Resign(context.Background())
	took := o.at.Sub(crashed)
	t.Logf("crashed leader replaced after %v (TTL %v)", took, testTTL)
	// The queue's bound: its head tries again when the lease runs out, and
	// every second in any case.
	if took > testTTL+2*time.Second {
		t.Fatalf("replaced after %v, more than TTL %v plus the queue's bound", took, testTTL)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("the crashed leader's term had not ended when b was elected")
	}
}
