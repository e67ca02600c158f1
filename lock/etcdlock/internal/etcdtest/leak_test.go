package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// TestNoGoroutineLeftAfterClose drives etcd Lockers through what starts
// goroutines of their own: grants and releases, waiters woken by the
// watch, renewals, Do with a panicking fn, an election term and an
// observer; then closes them, one with a lease still held. Nothing they started may still run: the
// goroutines of the cluster and of the clients, which outlive the
// Lockers, were there before it began.
func TestNoGoroutineLeftAfterClose(t *testing.T) {
	c := sharedCluster(t)
	clis := []*clientv3.Client{c.Client(t), c.Client(t)}
	ctx := ctxFor(t, time.Minute)
	for _, cli := range clis { // the clients' connections are up
		if _, err := cli.Get(ctx, "warm"); err != nil {
			t.Fatal(err)
		}
	}
	before := goleak.IgnoreCurrent()

	prefix := lock.WithPrefix("fk-" + fence.NewHolder()[:8] + ":")
	l1, err := etcdlockNew(clis[0], prefix)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := etcdlockNew(clis[1], prefix)
	if err != nil {
		t.Fatal(err)
	}

	// A grant and its release.
	a, err := l1.TryAcquire(ctx, "g", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Waiters of the other Locker, woken by the watch one after another.
	done := make(chan error, 3)
	for range 3 {
		go func() {
			s, err := l2.Acquire(ctx, "g", 2*time.Second)
			if err == nil {
				err = s.Release(ctx)
			}
			done <- err
		}()
	}
	time.Sleep(200 * time.Millisecond)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Renewals: a lease kept past its TTL, then released.
	r, err := l1.TryAcquire(ctx, "renewed", time.Second, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := r.Release(ctx); err != nil {
		t.Fatalf("the renewed lease: %v", err)
	}
	// Do with a fn that panics: the lease is released and the panic goes on.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Do swallowed the panic")
			}
		}()
		_ = l1.Do(ctx, "do", 2*time.Second, func(context.Context, fence.Fence) error { panic("fn") })
	}()
	if s, err := l2.TryAcquire(ctx, "do", 2*time.Second); err != nil {
		t.Fatalf("the lock of the panicking Do was not released: %v", err)
	} else if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// An election: a term, and an observer of another Locker.
	e1, err := election.New(l1, "leak", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e2, err := election.New(l2, "leak", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	obs, stop := context.WithCancel(ctx)
	ch := e2.Observe(obs)
	term, err := e1.Campaign(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-ch:
		if l.Token != term.Fence().Token {
			t.Fatalf("observed %+v", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the observer heard nothing")
	}
	if err := term.Resign(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		t.Fatal(err)
	}
	stop()
	for range ch { // the observer ends with its context
	}
	// A lease still held at Close, which releases no lease: its key ends
	// with its lease, and nothing of the Locker keeps it alive.
	if _, err := l1.TryAcquire(ctx, "kept", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	l1.Close()
	l2.Close()
	goleak.VerifyNone(t, append(clusterGoroutines, before)...)
}

// clusterGoroutines are the goroutines the cluster and the clients start
// while the test runs: the members' peer connections (HTTP, which no
// Locker uses) and the Partition's proxying of them, and gRPC's
// connections: a member's side of a client connection, and a client's
// transport, which its ClientConn opens again when a connection drops
// (seen on a loaded machine, torn down a moment after the check). A
// transport belongs to the client, which outlives the Lockers; what a
// Locker starts on it (watches, keep-alives, its own loops) runs in
// clientv3's or fencekit's code and is still found.
var clusterGoroutines = []goleak.Option{
	goleak.IgnoreAnyFunction("google.golang.org/grpc.(*Server).handleRawConn"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc.(*Server).handleRawConn.func1"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Server).keepalive"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Client).reader"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Client).keepalive"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*loopyWriter).run"),
	goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	goleak.IgnoreAnyFunction("github.com/fencekit/fencekit/lock/etcdlock/internal/etcdtest.(*Partition).serve"),
	goleak.IgnoreAnyFunction("github.com/fencekit/fencekit/lock/etcdlock/internal/etcdtest.(*Partition).pipe"),
}
