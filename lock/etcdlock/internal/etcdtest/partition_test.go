package etcdtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lock"
)

// TestHolderOnMemberCutOffFromPeers holds a lock, renewed, through a client
// of one member only, the leader, and then cuts that member off from its
// peers (both ways, on their peer ports): the member loses its quorum, its
// renewals fail, and the holder steps down (Done closes) within its TTL.
// A waiter on the other two members, the majority, is granted the lock
// only after that, with a higher token.
func TestHolderOnMemberCutOffFromPeers(t *testing.T) {
	c := StartCluster(t, 3)
	leader := c.Leader(t)
	cut := c.Members[leader]
	var rest []string
	for i, m := range c.Members {
		if i != leader {
			rest = append(rest, m.ClientURL())
		}
	}
	prefix := lock.WithPrefix("fk-cut:")
	held, err := etcdlockNew(c.ClientOf(t, cut.ClientURL()), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)
	other, err := etcdlockNew(c.ClientOf(t, rest...), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)

	ctx := ctxFor(t, 60*time.Second)
	const ttl = 2 * time.Second
	a, err := held.TryAcquire(ctx, "cut", ttl, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	// Renewals keep it past its TTL while the member has its peers.
	time.Sleep(ttl + 500*time.Millisecond)
	select {
	case <-a.Done():
		t.Fatalf("the renewed lease ended while its member had its peers: %v", a.Err())
	default:
	}
	// The grant is timed where Acquire returns, not where this goroutine
	// reads it, which is after the holder stepped down in any case.
	type grant struct {
		l  *lock.Lease
		at time.Time
	}
	got := make(chan grant, 1)
	go func() {
		l, err := other.Acquire(ctx, "cut", ttl)
		at := time.Now()
		if err != nil {
			t.Error(err)
		}
		got <- grant{l, at}
	}()
	cutAt := time.Now()
	c.Peers.Isolate(cut)
	defer c.Peers.Heal()

	var done time.Time
	select {
	case <-a.Done():
		done = time.Now()
	case <-time.After(30 * time.Second):
		t.Fatal("the holder on the cut-off member did not step down")
	}
	g := <-got
	b, granted := g.l, g.at
	if b == nil {
		return
	}
	if !granted.After(done) {
		t.Fatalf("the majority granted the lock at %v, before the holder stepped down at %v", granted, done)
	}
	if b.Fence().Token <= a.Fence().Token {
		t.Fatalf("token %d after %d", b.Fence().Token, a.Fence().Token)
	}
	t.Logf("holder stepped down %v after the cut, the majority granted %v after that",
		done.Sub(cutAt).Round(time.Millisecond), granted.Sub(done).Round(time.Millisecond))
	_ = b.Release(ctx)
}

// TestRenewalsSurviveFollowerCutOff cuts one follower off from its peers
// while the client of all three members still reaches it: renewals and
// reads sent to it get no answer, and must give up on it within a part of
// the TTL and go to another member. 6 renewed leases with a 5 s TTL must
// all stand 12 s later.
func TestRenewalsSurviveFollowerCutOff(t *testing.T) {
	c := StartCluster(t, 3)
	leader := c.Leader(t)
	follower := (leader + 1) % len(c.Members)
	l, err := etcdlockNew(c.Client(t), lock.WithPrefix("fk-follower:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx := ctxFor(t, 60*time.Second)
	const ttl = 5 * time.Second
	var leases []*lock.Lease
	for i := range 6 {
		a, err := l.TryAcquire(ctx, fmt.Sprint("f", i), ttl, lock.AutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, a)
	}
	c.Peers.Isolate(c.Members[follower])
	defer c.Peers.Heal()
	time.Sleep(12 * time.Second) // the span judged: every lease renewed through it
	lost := 0
	for _, a := range leases {
		select {
		case <-a.Done():
			lost++
			t.Logf("%s: %v", a.Fence().Resource, a.Err())
		default:
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d renewed leases lost with one follower cut off from its peers", lost, len(leases))
	}
	t.Logf("%d renewed leases of %v kept 12 s with one follower cut off from its peers", len(leases), ttl)
	// A release is a write, sent once: healed first, none waits on the
	// cut-off member.
	c.Peers.Heal()
	for _, a := range leases {
		_ = a.Release(ctx)
	}
}
