package election_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// observer collects what Observe reports until its context ends.
type observer struct {
	mu   sync.Mutex
	seen []election.Leader
	done chan struct{}
}

func observe(ctx context.Context, t testing.TB, c redis.UniversalClient, e *election.Election) *observer {
	t.Helper()
	o := &observer{done: make(chan struct{})}
	ch := e.Observe(ctx)
	go func() {
		defer close(o.done)
		for l := range ch {
			o.mu.Lock()
			o.seen = append(o.seen, l)
			o.mu.Unlock()
		}
	}()
	// Wait for the subscription, so that every term after this is announced
	// to the observer.
	for deadline := time.Now().Add(10 * time.Second); c.PubSubNumSub(ctx, electionKeys(e).Channel).Val()[electionKeys(e).Channel] < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("observer not subscribed after 10s")
		}
	}
	return o
}

// waitFor waits until the observer has seen token, and returns what it saw.
func (o *observer) waitFor(t testing.TB, token fence.Token) []election.Leader {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		o.mu.Lock()
		seen := append([]election.Leader(nil), o.seen...)
		o.mu.Unlock()
		if len(seen) > 0 && seen[len(seen)-1].Token >= token {
			return seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("observer saw %v, not token %d, after 10s", seen, token)
		}
	}
}

// checkObserved fails t unless seen holds exactly the terms won, in order.
func checkObserved(t testing.TB, won, seen []election.Leader) {
	t.Helper()
	for i := 1; i < len(seen); i++ {
		if seen[i].Token <= seen[i-1].Token {
			t.Fatalf("observer saw token %d after %d", seen[i].Token, seen[i-1].Token)
		}
	}
	j := 0
	for _, w := range won {
		for j < len(seen) && seen[j].Token < w.Token {
			j++
		}
		if j == len(seen) || seen[j] != w {
			t.Fatalf("observer missed term %+v; saw %v", w, seen)
		}
	}
	if len(seen) != len(won) {
		t.Fatalf("observer saw %d terms, %d were won: %v", len(seen), len(won), seen)
	}
}

// TestObserveSeesEveryTerm has three candidates take short terms in turn
// (each resigns at once) and checks that an observer saw every term, in
// order, with increasing tokens.
func TestObserveSeesEveryTerm(t *testing.T) {
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watcher := newElection(t, newLocker(t, c, prefix), "obs")
	o := observe(ctx, t, c, watcher)

	const perCandidate = 8
	var mu sync.Mutex
	var won []election.Leader
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		e := newElection(t, newLocker(t, c, prefix), "obs")
		wg.Go(func() {
			for range perCandidate {
				term, err := e.Campaign(ctx, name)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				won = append(won, election.Leader{Value: name, Token: term.Fence().Token})
				mu.Unlock()
				if err := term.Resign(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Terms are won one after another, so sorting by token is their order.
	sortByToken(won)
	seen := o.waitFor(t, won[len(won)-1].Token)
	checkObserved(t, won, seen)
	cancel()
	<-o.done
}
