package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

// TestElectionOnEtcd runs an election on etcd Lockers: the election uses
// only the backend's record beside the lock and its watch, so candidates
// campaign, a reader sees the leader, an observer hears each term through
// the watch, and a resignation hands the term to the queued candidate with
// a higher token. A leader that stops renewing steps down (Done) before the
// next candidate is elected.
func TestElectionOnEtcd(t *testing.T) {
	c := sharedCluster(t)
	ctx := ctxFor(t, time.Minute)
	prefix := lock.WithPrefix("fk-" + fence.NewHolder()[:8] + ":") // one set of locks for all
	newElection := func() *election.Election {
		l, err := etcdlock.New(c.Client(t), prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		e, err := election.New(l, "etcd-election", election.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ea, eb, watch := newElection(), newElection(), newElection()
	if _, err := watch.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader before any term: %v, want ErrNoLeader", err)
	}
	obs, stop := context.WithCancel(ctx)
	defer stop()
	ch := watch.Observe(obs)

	a, err := ea.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := watch.Leader(ctx); err != nil || l.Value != "a" || l.Token != a.Fence().Token {
		t.Fatalf("Leader: %+v %v, want a with token %d", l, err, a.Fence().Token)
	}
	select {
	case l := <-ch:
		if l.Value != "a" || l.Token != a.Fence().Token {
			t.Fatalf("observed %+v, want a", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the observer heard nothing of a")
	}
	type result struct {
		term *election.Term
		err  error
	}
	won := make(chan result, 1)
	go func() {
		term, err := eb.Campaign(ctx, "b")
		won <- result{term, err}
	}()
	time.Sleep(300 * time.Millisecond) // b queues
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var b result
	select {
	case b = <-won:
	case <-time.After(15 * time.Second):
		t.Fatal("b was not elected after a resigned")
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	if b.term.Fence().Token <= a.Fence().Token {
		t.Fatalf("b's token %d is not above a's %d", b.term.Fence().Token, a.Fence().Token)
	}
	select {
	case l := <-ch:
		if l.Value != "b" || l.Token != b.term.Fence().Token {
			t.Fatalf("observed %+v, want b", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the observer heard nothing of b")
	}
	if err := b.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
