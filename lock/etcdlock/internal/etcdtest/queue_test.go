package etcdtest

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// queued joins r's waiter, waits until its watch covers hand-overs, and
// queues r with a refused try.
func queued(t *testing.T, b *backend.Backend, r *lockbackend.Request) lockbackend.Waiter {
	t.Helper()
	w := b.Join(r.Resource, r.Holder, true)
	t.Cleanup(func() { w.Leave(false) })
	ready, _, ok := w.State()
	if !ok {
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Fatal("waiter's watch not confirmed after 10s")
		}
	}
	q := *r
	q.Queue = true
	out, err := b.Try(ctxFor(t, 10*time.Second), &q)
	if err != nil || out.Granted || out.Ref == 0 {
		t.Fatalf("queueing try: granted=%v ref=%d err=%v", out.Granted, out.Ref, err)
	}
	return w
}

func handedOver(t *testing.T, b *backend.Backend, w lockbackend.Waiter, r *lockbackend.Request, within time.Duration) (lockbackend.HandOver, lockbackend.Hold) {
	t.Helper()
	select {
	case g := <-w.Granted():
		return g, b.Adopt(r, g)
	case <-time.After(within):
		t.Fatalf("no hand-over to %s within %v", r.Holder[:8], within)
	}
	return lockbackend.HandOver{}, nil
}

// TestQueueHandsOverInArrivalOrder checks that waiters queued behind a
// holder are handed the lock in the order they queued, each woken by the
// release before it through the watch, with increasing tokens.
func TestQueueHandsOverInArrivalOrder(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	a := mustGrant(t, b, req("q", 10*time.Second))
	rb, rc := req("q", 10*time.Second), req("q", 10*time.Second)
	wb := queued(t, b, rb)
	wc := queued(t, b, rc)
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wc.Granted():
		t.Fatal("the second waiter was handed the lock before the first")
	case <-time.After(200 * time.Millisecond):
	}
	gb, hb := handedOver(t, b, wb, rb, 10*time.Second)
	if gb.Token <= a.Token {
		t.Fatalf("hand-over token %d not above %d", gb.Token, a.Token)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), hb); err != nil {
		t.Fatalf("release of the handed-over grant: %v", err)
	}
	gc, hc := handedOver(t, b, wc, rc, 10*time.Second)
	if gc.Token <= gb.Token {
		t.Fatalf("second hand-over token %d not above %d", gc.Token, gb.Token)
	}
	if _, err := b.Extend(ctxFor(t, 5*time.Second), hc, 10*time.Second); err != nil {
		t.Fatalf("Extend of the adopted grant: %v", err)
	}
}

// TestVanishedWaiterCostsAtMostItsLease checks that a waiter that queued
// and vanished (it never refreshes, never takes its hand-over) delays the
// next waiter by no more than its own lease, or QueueLife when that is
// longer.
func TestVanishedWaiterCostsAtMostItsLease(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	a := mustGrant(t, b, req("v", 10*time.Second))
	gone := req("v", 2*time.Second)
	gone.Queue = true
	if out, err := b.Try(ctxFor(t, 5*time.Second), gone); err != nil || out.Granted {
		t.Fatalf("vanishing waiter's try: %v %v", out.Granted, err)
	}
	rc := req("v", 10*time.Second)
	wc := queued(t, b, rc)
	released := time.Now()
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	handedOver(t, b, wc, rc, 15*time.Second)
	// The vanished waiter's key ends 3s (QueueLife, longer than its 2s
	// TTL) after its try, when its process deletes it (its process lives
	// on and keeps the lease alive); the watch takes a moment: 6s is a
	// generous bound on a loaded machine.
	if d := time.Since(released); d > 6*time.Second {
		t.Fatalf("the next waiter waited %v after the release, more than the vanished waiter's lease", d)
	} else {
		t.Logf("next waiter granted %v after the release (vanished waiter's lease: 2s)", d.Round(time.Millisecond))
	}
}

// TestHandOverDatedByLastKeepAlive queues a waiter while its session's
// keep-alives are stopped, and hands it the lock: the Locker dates the
// handed-over lease from the waiter's try plus the HandOver's Age, for its
// TTL, and that must end no later than what the last keep-alive the server
// acknowledged guarantees, less the drift allowance.
func TestHandOverDatedByLastKeepAlive(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	holder := newBackendAt(t, c.Client(t), b)
	a := mustGrant(t, holder, req("dated", 10*time.Second))
	mustGrant(t, b, req("warm", 2*time.Second)) // the waiter's session, 2s
	frozen := time.Now()
	b.Freeze(false) // no keep-alive is sent, so none later is acknowledged
	defer b.Thaw()
	time.Sleep(300 * time.Millisecond)
	rb := req("dated", 2*time.Second)
	wb := b.Join(rb.Resource, rb.Holder, true)
	defer wb.Leave(true)
	if ready, _, ok := wb.State(); !ok {
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Fatal("waiter's watch not confirmed after 10s")
		}
	}
	q := *rb
	q.Queue = true
	sent := time.Now() // as the Locker dates a try: before sending it
	if out, err := b.Try(ctxFor(t, 10*time.Second), &q); err != nil || out.Granted || out.Ref == 0 {
		t.Fatalf("queueing try: granted=%v ref=%d err=%v", out.Granted, out.Ref, err)
	}
	if err := holder.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	g, _ := handedOver(t, b, wb, rb, 10*time.Second)
	counted := sent.Add(g.Age).Add(rb.TTL)
	bound := frozen.Add(2 * time.Second)
	if counted.After(bound) {
		t.Fatalf("the hand-over's lease is counted to %v after the freeze, past the %v the last keep-alive guarantees",
			counted.Sub(frozen), bound.Sub(frozen))
	}
	t.Logf("hand-over Age %v: counted to %v after the freeze (bound 2s)", g.Age.Round(time.Millisecond), counted.Sub(frozen).Round(time.Millisecond))
}

// TestLateHandOverWakesWaiter hands the lock to a waiter whose last
// refresh is older than its TTL: a hand-over counted from that refresh
// would be over on arrival, so the waiter is woken to try instead, and its
// try grants it a lease counted from that try.
func TestLateHandOverWakesWaiter(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	holder := newBackendAt(t, c.Client(t), b)
	a := mustGrant(t, holder, req("late", 10*time.Second))
	rw := req("late", 300*time.Millisecond)
	w := queued(t, b, rw)
	time.Sleep(400 * time.Millisecond) // past the TTL, within the queue's life
	if err := holder.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Wake():
	case g := <-w.Granted():
		t.Fatalf("handed a lease counted from a refresh older than its TTL (Age %v) instead of woken", g.Age)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was neither woken nor handed the lock within 10s")
	}
	q := *rw
	q.Queue = true
	out, err := b.Try(ctxFor(t, 10*time.Second), &q)
	if err != nil || !out.Granted || out.Known <= 0 {
		t.Fatalf("the woken waiter's try: granted=%v known=%v err=%v", out.Granted, out.Known, err)
	}
}
