package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The deadline tests' figures, as the lock's: a 300 ms context and a margin
// for a loaded machine, both far below go-redis's default read timeout
// (5 s), which the election's calls used to wait for.
const (
	silentTimeout = 300 * time.Millisecond
	silentMargin  = 250 * time.Millisecond
)

// silentClient returns a client made with go-redis's default options
// (ContextTimeoutEnabled off, a 5 s read timeout, 3 retries), as most users
// make it, that reaches addr through a proxy the test can black-hole.
func silentClient(t *testing.T, addr string) (*redis.Client, *testenv.Proxy) {
	t.Helper()
	proxy := testenv.StartProxy(t, addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil { // a warm connection
		t.Fatal(err)
	}
	return c, proxy
}

// returnsBy runs call with a silentTimeout context and fails t unless it
// returns an error matching the context's within silentTimeout+silentMargin.
func returnsBy(t *testing.T, name string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), silentTimeout)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	took := time.Since(start)
	t.Logf("%s with a %v context and Redis silent: %v (%v)", name, silentTimeout, took.Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", name, err)
	}
	if took > silentTimeout+silentMargin {
		t.Errorf("%s returned after %v, past its %v deadline", name, took.Round(time.Millisecond), silentTimeout)
	}
}

// With a client made with default options, every election call returns by
// its context's deadline when Redis went silent, and Observe's channel
// closes soon after its context is cancelled, as the lock's calls do.
func TestElectionCallsReturnByTheDeadlineWithDefaultClientOptions(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	c, proxy := silentClient(t, srv.Addr())
	t.Cleanup(proxy.Unblock)
	const prefix = "el:"
	e := newElection(t, newLocker(t, c, prefix), "silent")
	other := newElection(t, newLocker(t, srv.Client(), prefix), "silent")
	// A term won through the silent client loads the record's scripts.
	warm := mustCampaign(t, e, "warm")
	if err := warm.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	leader := mustCampaign(t, other, "other")
	t.Cleanup(func() { _ = leader.Resign(context.Background()) })
	if got, err := e.Leader(context.Background()); err != nil || got.Value != "other" {
		t.Fatalf("Leader = %+v, %v", got, err)
	}
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	obs := e.Observe(octx)
	if l := <-obs; l.Value != "other" {
		t.Fatalf("Observe reported %+v first", l)
	}

	proxy.Block()
	returnsBy(t, "Leader", func(ctx context.Context) error {
		_, err := e.Leader(ctx)
		return err
	})
	returnsBy(t, "Campaign", func(ctx context.Context) error {
		_, err := e.Campaign(ctx, "me")
		return err
	})
	// Observe reads the leader every third of the TTL: let one read be
	// under way, then cancel.
	time.Sleep(testTTL / 2)
	start := time.Now()
	ocancel()
	for range obs {
	}
	took := time.Since(start)
	t.Logf("Observe's channel closed %v after its context was cancelled, Redis silent", took.Round(time.Millisecond))
	if took > silentMargin {
		t.Errorf("Observe's channel closed %v after its context was cancelled, want within %v", took.Round(time.Millisecond), silentMargin)
	}
}

// A Redlock election with one node of three silent (default client
// options) waits for that node no longer than the node timeout once the
// others answered: the next candidate leads soon after a resignation, and
// Leader with a context that has no deadline returns the leader.
func TestRedlockElectionWithASilentNode(t *testing.T) {
	testenv.Slow(t)
	const nodeTimeout = 300 * time.Millisecond
	var clients []redis.UniversalClient
	var proxy *testenv.Proxy
	for i := range 3 {
		s := testenv.StartRedis(t)
		if i < 2 {
			c := s.Client()
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
			continue
		}
		var c *redis.Client
		c, proxy = silentClient(t, s.Addr())
		clients = append(clients, c)
	}
	t.Cleanup(proxy.Unblock)
	redlock := func() *lock.Locker {
		l, err := lock.NewRedlock(clients, lock.WithPrefix("el:"), lock.WithNodeTimeout(nodeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	ttl := election.WithTTL(3 * time.Second)
	ea, eb := newElection(t, redlock(), "quorum", ttl), newElection(t, redlock(), "quorum", ttl)
	watch := newElection(t, redlock(), "quorum", ttl)
	ctx := context.Background()
	a := mustCampaign(t, ea, "a") // loads every script on every node
	bc := campaignAsync(ctx, eb, "b")
	time.Sleep(50 * time.Millisecond) // b is polling for the lock

	proxy.Block()
	resigned := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var o outcome
	select {
	case o = <-bc:
	case <-time.After(15 * time.Second):
		t.Fatal("no new leader 15s after the resignation")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	t.Cleanup(func() { _ = o.term.Resign(context.Background()) })
	// The resignation's release, b's grant and b's record each wait for
	// the silent node up to the node timeout; b polls for the lock on top.
	bound := 4*nodeTimeout + silentMargin
	took := o.at.Sub(resigned)
	t.Logf("Redlock, one node of three silent, node timeout %v: the next candidate led %v after the resignation", nodeTimeout, took.Round(time.Millisecond))
	if took > bound {
		t.Errorf("the next candidate led %v after the resignation, want within %v", took.Round(time.Millisecond), bound)
	}

	start := time.Now()
	got, err := watch.Leader(context.Background())
	took = time.Since(start)
	t.Logf("Leader with a Background context, one node silent: %v (%+v, %v)", took.Round(time.Millisecond), got, err)
	if err != nil || got.Value != "b" {
		t.Errorf("Leader = %+v, %v, want b", got, err)
	}
	if took > nodeTimeout+silentMargin {
		t.Errorf("Leader took %v with a quorum answering, past the %v node timeout", took.Round(time.Millisecond), nodeTimeout)
	}
}
