package election_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// cutRound is one leader cut off from Redis while a candidate waits.
type cutRound struct {
	a, b        *election.Term
	cutToDone   time.Duration // from the cut to the old term's Done
	cutToLeader time.Duration // from the cut to the new leader's election
}

// cutLeader elects a through a fault proxy and queues b (connected
// directly), cuts a off (every byte held, as a partition does) at a random
// point of its renewal cycle, and waits for a's term to end and b's to
// begin (checkStepDown judges their timing). It reports false, having
// checked nothing, when a's term ended before the cut (a loaded machine
// delayed its renewal past the step-down margin).
func cutLeader(t *testing.T, srv *testenv.RedisServer, name string) (cutRound, bool) {
	t.Helper()
	ctx := context.Background()
	proxy := testenv.StartProxy(t, srv.Addr())
	// ContextTimeoutEnabled: a call to a silent server ends at its context's
	// deadline (the renewal's), not at the 3s read timeout.
	ca := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = ca.Close() })
	const prefix = "el:"
	la := newLocker(t, ca, prefix)
	ea := newElection(t, la, name)
	eb := newElection(t, newLocker(t, srv.Client(), prefix), name)

	a := mustCampaign(t, ea, "a")
	bc := campaignAsync(ctx, eb, "b")
	lostEarly := func() (cutRound, bool) {
		if o := <-bc; o.term != nil {
			_ = o.term.Resign(ctx)
		}
		return cutRound{}, false
	}
	queue := keysOf(la).LockKey(name)
	queue = queue[:len(queue)-len(":lock")] + ":queue"
	for deadline := time.Now().Add(10 * time.Second); srv.Client().ZCard(ctx, queue).Val() < 1; time.Sleep(2 * time.Millisecond) {
		if a.Err() != nil {
			return lostEarly()
		}
		if time.Now().After(deadline) {
			t.Fatal("b not queued after 10s")
		}
	}
	time.Sleep(rand.N(testTTL / 3))
	if a.Err() != nil {
		return lostEarly()
	}
	cut := time.Now()
	proxy.Block()
	t.Cleanup(proxy.Unblock)

	var r cutRound
	r.a = a
	select {
	case <-a.Done():
		r.cutToDone = time.Since(cut)
	case <-time.After(10 * time.Second):
		t.Fatal("the cut-off leader's term did not end within 10s")
	}
	var o outcome
	select {
	case o = <-bc:
	case <-time.After(10 * time.Second):
		t.Fatal("no new leader 10s after the cut")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	r.b, r.cutToLeader = o.term, o.at.Sub(cut)
	t.Cleanup(func() { _ = r.b.Resign(context.Background()) })
	if !errors.Is(a.Err(), election.ErrLost) || !errors.Is(a.Err(), lock.ErrNotHeld) {
		t.Errorf("cut-off term's Err = %v, want ErrLost and lock.ErrNotHeld", a.Err())
	}
	if a.Leading() {
		t.Error("cut-off term still Leading")
	}
	if r.b.Fence().Token <= a.Fence().Token {
		t.Errorf("new term's token %d not above the old one's %d", r.b.Fence().Token, a.Fence().Token)
	}
	return r, true
}

// checkStepDown judges a cut round's timing: the old leader stepped down
// before the new one was elected, by the step-down margin. Both instants
// are taken in this process, on one clock, each when a goroutine saw it:
// a loaded machine's scheduling delays move them, which the allowance
// below covers in part. TestCutLeaderStepsDownFirst judges it; the rounds
// other tests cut for a deposed leader do not depend on it.
func checkStepDown(t *testing.T, r cutRound) {
	t.Helper()
	if r.cutToDone >= r.cutToLeader {
		t.Errorf("old term ended %v after the cut, new leader elected %v after it: two leaders believed they led", r.cutToDone, r.cutToLeader)
	}
	// And by the margin: the documented default (a quarter of the TTL), of
	// which a loaded machine's delays may eat two thirds.
	if gap := r.cutToLeader - r.cutToDone; gap < stepDownMargin/3 {
		t.Errorf("old term ended %v before the new leader was elected, below a third of the %v step-down margin", gap, stepDownMargin)
	}
}

// TestCutLeaderStepsDownFirst cuts a leader off from Redis and checks that
// its term ends before another candidate is elected; it logs how long each
// took. FENCEKIT_ELECTION_ROUNDS sets the number of rounds (default 3) for a
// measurement:
//
//	FENCEKIT_ELECTION_ROUNDS=40 go test -count=1 -run TestCutLeaderStepsDownFirst -v ./election
func TestCutLeaderStepsDownFirst(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("FENCEKIT_ELECTION_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	var done, elected, gaps []time.Duration
	for i := 0; len(done) < rounds; i++ {
		if i == 2*rounds+3 {
			t.Fatalf("%d of %d rounds lost their term before the cut", i-len(done), i)
		}
		// A subtest per round, so that each round's proxy, clients and
		// terms are cleaned up before the next.
		t.Run(fmt.Sprintf("round%d", i), func(t *testing.T) {
			r, ok := cutLeader(t, srv, fmt.Sprintf("cut%d", i))
			if !ok {
				t.Log("the leader's term ended before the cut (its renewal came late): another round")
				return
			}
			checkStepDown(t, r)
			done, elected = append(done, r.cutToDone), append(elected, r.cutToLeader)
			gaps = append(gaps, r.cutToLeader-r.cutToDone)
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("TTL %v, step-down margin %v, %d rounds: cut→old term Done p50 %v max %v; cut→new leader p50 %v max %v; gap from the old term's end to the new leader: min %v p50 %v",
		testTTL, stepDownMargin, rounds, pct(done, 50), pct(done, 100), pct(elected, 50), pct(elected, 100), pct(gaps, 0), pct(gaps, 50))
}

// pct returns the p-th percentile of ds (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := max((p*len(s)+99)/100-1, 0)
	return s[min(i, len(s)-1)].Round(time.Millisecond)
}

// stepDownMargin is the default step-down margin at the test TTL.
var stepDownMargin = testTTL / election.StepDownDivisor
