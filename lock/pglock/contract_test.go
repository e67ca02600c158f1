package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// contractBackend is the backend as package lock sees it, on pool.
func contractBackend(t *testing.T, cfg config) (*pgBackend, func() *pgBackend) {
	t.Helper()
	pool := migratedPool(t)
	mk := func() *pgBackend {
		p, err := open(testBackend(t, pool, cfg), lockbackend.Settings{Retention: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return mk(), mk
}

func TestContractGrantExtendReleaseTTL(t *testing.T) {
	p, _ := contractBackend(t, config{})
	ctx := ctxFor(t, 30*time.Second)
	if info := p.Info(); info.Name != "postgres" || !info.Queue || info.Owner || info.Quorum != 1 {
		t.Fatalf("Info = %+v", info)
	}
	req := &lockbackend.Request{Resource: "r", TTL: 2 * time.Second, Holder: fence.NewHolder(), Ordered: true}
	out, err := p.Try(ctx, req)
	if err != nil || !out.Granted || out.Token < 1 || out.Known != 2*time.Second || !out.StateMissed || out.Holder != req.Holder {
		t.Fatalf("Try = %+v, %v", out, err)
	}
	other, err := p.Try(ctx, &lockbackend.Request{Resource: "r", TTL: time.Second, Holder: fence.NewHolder(), Ordered: true})
	if err != nil || other.Granted || other.Remaining <= 0 || other.Ref != 0 {
		t.Fatalf("second Try = %+v, %v; want a refusal, not queued", other, err)
	}
	if d, err := p.Extend(ctx, out.Hold, 5*time.Second); err != nil || d != 5*time.Second {
		t.Fatalf("Extend = %v, %v", d, err)
	}
	if d, err := p.TTL(ctx, out.Hold); err != nil || d <= 4*time.Second || d > 5*time.Second {
		t.Fatalf("TTL = %v, %v", d, err)
	}
	if err := p.Release(ctx, out.Hold); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, out.Hold); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if _, err := p.TTL(ctx, out.Hold); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("TTL after release = %v, want ErrNotHeld", err)
	}
	if _, err := p.Extend(ctx, out.Hold, time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("Extend after release = %v, want ErrNotHeld", err)
	}
	if _, err := p.Try(ctx, &lockbackend.Request{Resource: "r", TTL: time.Second, Holder: "h", Owner: "o"}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Try with an owner = %v, want ErrUnsupported (fence.ErrInvalid)", err)
	}
	// Advance raises the counter: the next grant is above it.
	next := out.Token + 1_000_000_000
	if err := p.Advance(ctx, "r", next); err != nil {
		t.Fatal(err)
	}
	g, err := p.Try(ctx, &lockbackend.Request{Resource: "r", TTL: time.Second, Holder: fence.NewHolder(), Ordered: true})
	if err != nil || !g.Granted || g.Token <= next {
		t.Fatalf("Try after Advance(%d) = %+v, %v", next, g, err)
	}
}

func TestContractRefusesRedisOptions(t *testing.T) {
	for _, given := range []lockbackend.Given{lockbackend.GivenPrefix, lockbackend.GivenNodeTimeout} {
		if _, err := open(&backend{}, lockbackend.Settings{Given: given}); !errors.Is(err, lockbackend.ErrUnsupported) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Given %d: %v, want lock.ErrUnsupported (and fence.ErrInvalid)", given, err)
		}
	}
}

// TestContractHandOver: a waiter confirmed and queued is handed the lock
// by the release and told so with its token; the waiter behind it is told
// its place; a waiter that leaves does so in one call.
func TestContractHandOver(t *testing.T) {
	p, mk := contractBackend(t, config{})
	q := mk() // another process
	ctx := ctxFor(t, 30*time.Second)
	h0 := &lockbackend.Request{Resource: "r", TTL: time.Minute, Holder: fence.NewHolder(), Ordered: true}
	first, err := p.Try(ctx, h0)
	if err != nil || !first.Granted {
		t.Fatal(first, err)
	}
	join := func(b *pgBackend, holder string) lockbackend.Waiter {
		w := b.Join("r", holder, true)
		ready, _, _ := w.State()
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Fatal("waiter not confirmed")
		}
		return w
	}
	r1 := &lockbackend.Request{Resource: "r", TTL: 2 * time.Second, Holder: fence.NewHolder(), Ordered: true, Queue: true}
	w1 := join(q, r1.Holder)
	defer w1.Leave(false)
	o1, err := q.Try(ctx, r1)
	if err != nil || o1.Granted || o1.Place != 0 || o1.Ref == 0 {
		t.Fatalf("first waiter's try = %+v, %v; want queued first", o1, err)
	}
	r2 := &lockbackend.Request{Resource: "r", TTL: time.Second, Holder: fence.NewHolder(), Ordered: true, Queue: true}
	w2 := join(p, r2.Holder)
	defer w2.Leave(false)
	o2, err := p.Try(ctx, r2)
	if err != nil || o2.Granted || o2.Place != 1 {
		t.Fatalf("second waiter's try = %+v, %v; want queued second", o2, err)
	}
	if err := p.Release(ctx, first.Hold); err != nil {
		t.Fatal(err)
	}
	var ho lockbackend.HandOver
	select {
	case ho = <-w1.Granted():
	case <-time.After(10 * time.Second):
		t.Fatal("the first waiter was not told of its grant")
	}
	if ho.Token <= first.Token || ho.Ref != o1.Ref || ho.Age < 0 {
		t.Fatalf("hand-over %+v; want a token above %d on entry %d", ho, first.Token, o1.Ref)
	}
	select {
	case pl := <-w2.Placed():
		if pl.Place != 0 || pl.Remaining <= 0 || pl.Remaining > 2*time.Second {
			t.Fatalf("second waiter's place %+v; want first, with the new lease left", pl)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter was not told it is first")
	}
	// The first waiter's try finds the grant (as lock does with a stale
	// hand-over), and Adopt makes the same hold without one.
	again, err := q.Try(ctx, r1)
	if err != nil || !again.Granted || !again.HandedOver || again.Token != ho.Token {
		t.Fatalf("first waiter's try after the hand-over = %+v, %v", again, err)
	}
	h := q.Adopt(r1, ho)
	// The second gives up: one call takes it out of the queue.
	if err := p.Abandon(ctx, "r", r2.Holder, ""); err != nil {
		t.Fatal(err)
	}
	if n := waiters(t, p.pool, "r"); n != 0 {
		t.Fatalf("%d entries left after Abandon", n)
	}
	if err := q.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestContractWakeWhenOnlyLapsedWaiters: a release that finds only lapsed
// entries frees the lock and wakes one waiter of the process.
func TestContractWakeWhenOnlyLapsedWaiters(t *testing.T) {
	p, _ := contractBackend(t, config{})
	ctx := ctxFor(t, 30*time.Second)
	first, err := p.Try(ctx, &lockbackend.Request{Resource: "r", TTL: time.Minute, Holder: fence.NewHolder(), Ordered: true})
	if err != nil || !first.Granted {
		t.Fatal(first, err)
	}
	gone := &lockbackend.Request{Resource: "r", TTL: time.Second, Holder: fence.NewHolder(), Ordered: true, Queue: true}
	if o, err := p.Try(ctx, gone); err != nil || o.Granted {
		t.Fatal(o, err)
	}
	if _, err := p.pool.Exec(ctx, `UPDATE fencekit_lock_waiter SET refreshed = refreshed - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	w := p.Join("r", fence.NewHolder(), true)
	defer w.Leave(false)
	ready, _, _ := w.State()
	<-ready
	if err := p.Release(ctx, first.Hold); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Wake():
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after a release that found only lapsed waiters")
	}
}

// TestContractRecord: PutRecord, KeepRecord, ReadRecord and WatchRecord.
func TestContractRecord(t *testing.T) {
	p, _ := contractBackend(t, config{})
	ctx := ctxFor(t, 30*time.Second)
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	watch := p.WatchRecord(watchCtx, "e")
	if _, err := p.ReadRecord(ctx, "e"); !errors.Is(err, lockbackend.ErrNoRecord) {
		t.Fatalf("ReadRecord of nothing = %v, want ErrNoRecord", err)
	}
	o, err := p.Try(ctx, &lockbackend.Request{Resource: "e", TTL: time.Minute, Holder: fence.NewHolder(), Ordered: true})
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	f := fence.Fence{Resource: "e", Token: o.Token, Holder: o.Holder}
	if err := p.PutRecord(ctx, f, "leader a", time.Second); err != nil {
		t.Fatal(err)
	}
	// The watch is a doorbell (a zero Record: read the record), never
	// the notification's word for it (see WatchRecord).
	select {
	case rec := <-watch:
		if rec != (lockbackend.Record{}) {
			t.Fatalf("watched %+v, want a zero Record", rec)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch saw no write")
	}
	if rec, err := p.ReadRecord(ctx, "e"); err != nil || rec.Value != "leader a" || rec.Token != o.Token {
		t.Fatalf("ReadRecord = %+v, %v", rec, err)
	}
	if err := p.KeepRecord(ctx, f, time.Second); err != nil {
		t.Fatal(err)
	}
	stranger := fence.Fence{Resource: "e", Token: o.Token, Holder: "someone else"}
	if err := p.PutRecord(ctx, stranger, "x", time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("PutRecord by a non-holder = %v, want ErrNotHeld", err)
	}
	if err := p.KeepRecord(ctx, stranger, time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("KeepRecord by a non-holder = %v, want ErrNotHeld", err)
	}
	if err := p.Release(ctx, o.Hold); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReadRecord(ctx, "e"); !errors.Is(err, lockbackend.ErrNoRecord) {
		t.Fatalf("ReadRecord after the release = %v, want ErrNoRecord", err)
	}
}
