package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// TestPausedHolderStepsDownFirst leaves a holder's lease alone: neither
// extended nor released. The next holder, queued behind it, is handed the
// lock once the lease ended, and the holder had stepped down (its known
// validity ended) before that grant; its late extension and release are
// refused.
//
// Left alone, the holder's process goes on keeping its session's lease
// alive (other keys may stand on it), so the backend itself deletes the
// key at the lease's end. Paused, the process keeps nothing alive and
// deletes nothing, and the etcd server expires the session's lease.
func TestPausedHolderStepsDownFirst(t *testing.T) {
	for _, paused := range []bool{false, true} {
		name := map[bool]string{false: "left-alone", true: "paused"}[paused]
		t.Run(name, func(t *testing.T) { pausedHolder(t, paused) })
	}
}

func pausedHolder(t *testing.T, paused bool) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	// Another grant on the same session, whose lease the process would
	// keep alive for it.
	mustGrant(t, b, req("other", 2*time.Second))
	ra := req("p", 2*time.Second)
	sent := time.Now()
	a := mustGrant(t, b, ra)
	stepDown := sent.Add(a.Known)
	// The waiter is another process's.
	wbe := newBackendAt(t, c.Client(t), b)
	rb := req("p", 10*time.Second)
	wb := queued(t, wbe, rb)
	if paused {
		b.Freeze(true)
	}
	g, _ := handedOver(t, wbe, wb, rb, 15*time.Second)
	granted := time.Now()
	b.Thaw()
	if !granted.After(stepDown) {
		t.Fatalf("the next holder was granted at %v, before the holder stepped down at %v", granted, stepDown)
	}
	if g.Token <= a.Token {
		t.Fatalf("token %d after %d", g.Token, a.Token)
	}
	t.Logf("the holder stepped down %v before the lock was handed on", granted.Sub(stepDown).Round(time.Millisecond))
	if _, err := b.Extend(ctxFor(t, 5*time.Second), a.Hold, 2*time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("late Extend: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("late Release: %v, want ErrNotHeld", err)
	}
}

// TestValidityFromLastKeepAlive stops a session's keep-alives for a while
// and then grants on it: the grant believes no more than what the last
// keep-alive the server acknowledged guarantees, less the drift
// allowance, not the TTL asked for.
func TestValidityFromLastKeepAlive(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	mustGrant(t, b, req("warm", 2*time.Second)) // the session's lease, 2s
	frozen := time.Now()
	b.Freeze(false) // keep-alives stop; no later one can be acknowledged
	time.Sleep(700 * time.Millisecond)
	start := time.Now()
	out := mustGrant(t, b, req("late", 2*time.Second))
	b.Thaw()
	bound := frozen.Add(2 * time.Second).Sub(start)
	if out.Known > bound {
		t.Fatalf("known %v, more than the %v the last acknowledged keep-alive guarantees", out.Known, bound)
	}
	if out.Known <= 0 {
		t.Fatalf("known %v", out.Known)
	}
	t.Logf("known %v of the 2s asked, bound %v", out.Known, bound)
}

// TestLostGrantReplyLeavesNoLock loses the reply of the transaction that
// puts the holder's key: the try fails, and the lease it may have put the
// key on is revoked, so the lock is free at once rather than after the
// lease's 30 seconds.
func TestLostGrantReplyLeavesNoLock(t *testing.T) {
	c := StartCluster(t, 3)
	m := c.Members[0]
	cli := c.ClientOf(t, m.ClientURL())
	b := newBackend(t, cli)
	// The proxy loses the next reply on the connection. Now and then the
	// grant is answered all the same: the reply lost was another stream's
	// (a keep-alive's), or etcd's client sent the call again on a new
	// connection and the backend's try found its own grant. Then the grant
	// is known: it is released, and the loss tried again on a resource of
	// its own, a few times at most.
	var lost bool
	b.BeforeTxn = func() {
		if !lost {
			lost = true
			m.Proxy.LoseNextReply(nil)
		}
	}
	resource := ""
	for attempt := range 5 {
		resource = fmt.Sprintf("lost-%d", attempt)
		lost = false
		out, err := b.Try(ctxFor(t, 10*time.Second), req(resource, 30*time.Second))
		if err != nil {
			break
		}
		if attempt == 4 {
			t.Fatal("Try whose reply was lost returned no error, five times")
		}
		t.Logf("attempt %d: the grant was answered despite the lost reply", attempt)
		if out.Granted {
			if err := b.Release(ctxFor(t, 10*time.Second), out.Hold); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m.Proxy.Faults().Lost == 0 {
		t.Fatal("no reply was lost")
	}
	b.BeforeTxn = nil
	other := newBackendAt(t, c.Client(t), b)
	// The deletion sent at once may fail while the client reconnects;
	// then the next keep-alive tick of the key's session (every fifth of
	// its 30 s lease) deletes it: two ticks and a margin.
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := other.Try(ctxFor(t, 5*time.Second), req(resource, 30*time.Second))
		if err == nil && out.Granted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock is still taken 15s after the lost reply (err %v): the grant nobody knows of was not undone", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDeadlineKeptWhenMemberCutOff cuts the client off from the only member
// it talks to: the try returns by its deadline with an error matching
// ctx.Err(), and once the member is back, no lock is left behind.
func TestDeadlineKeptWhenMemberCutOff(t *testing.T) {
	c := StartCluster(t, 3)
	m := c.Members[1]
	cli := c.ClientOf(t, m.ClientURL())
	b := newBackend(t, cli)
	mustGrant(t, b, req("warm", 5*time.Second)) // the connection is up
	var cut bool
	b.BeforeTxn = func() {
		if !cut {
			cut = true
			m.Proxy.Block()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := b.Try(ctx, req("cut", 30*time.Second))
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Try while cut off: %v, want one matching context.DeadlineExceeded", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Try returned %v after its 1s deadline", took)
	}
	m.Proxy.Unblock()
	b.BeforeTxn = nil
	other := newBackendAt(t, c.Client(t), b)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := other.Try(ctxFor(t, 5*time.Second), req("cut", 30*time.Second))
		if err == nil && out.Granted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock still taken 10s after the cut ended (err %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTokensIncreaseAcrossLeaderRestart stops the leader member and starts
// it again while a lease is held and grants go on: tokens keep increasing,
// and the lease granted before the failover is still held after it.
func TestTokensIncreaseAcrossLeaderRestart(t *testing.T) {
	c := StartCluster(t, 3)
	b := newBackend(t, c.Client(t))
	held := mustGrant(t, b, req("held", 10*time.Second))
	var last fence.Token
	grant := func(phase string) {
		t.Helper()
		var out lockbackend.Outcome
		var err error
		for range 50 { // calls fail while the cluster elects a new leader
			out, err = b.Try(ctxFor(t, 5*time.Second), req("r", 5*time.Second))
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || !out.Granted {
			t.Fatalf("%s: granted=%v err=%v", phase, out.Granted, err)
		}
		if out.Token <= last {
			t.Fatalf("%s: token %d after %d", phase, out.Token, last)
		}
		last = out.Token
		if err := b.Release(ctxFor(t, 5*time.Second), out.Hold); err != nil {
			t.Fatalf("%s: release: %v", phase, err)
		}
	}
	for range 5 {
		grant("before")
	}
	leader := c.Leader(t)
	c.Stop(leader)
	for range 5 {
		grant("leader stopped")
	}
	if _, err := b.Extend(ctxFor(t, 10*time.Second), held.Hold, 10*time.Second); err != nil {
		t.Fatalf("the lease granted before the failover: %v", err)
	}
	c.Restart(t, leader)
	for range 5 {
		grant("leader restarted")
	}
	newLeader := c.Leader(t)
	c.Stop(newLeader)
	c.Restart(t, newLeader)
	for range 5 {
		grant("second leader restarted")
	}
}

// TestConnectionCutKeepsWaiter cuts the client's connection while a waiter
// waits: its watch is said lost, comes back, and the release made while it
// was cut still hands the lock over.
func TestConnectionCutKeepsWaiter(t *testing.T) {
	c := StartCluster(t, 3)
	m := c.Members[2]
	b := newBackend(t, c.ClientOf(t, m.ClientURL()))
	// The holder reaches the other members only: the cut is the waiter's
	// alone, so the release is made, and answered, while it lasts.
	holder := newBackendAt(t, c.ClientOf(t, c.Members[0].ClientURL(), c.Members[1].ClientURL()), b)
	a := mustGrant(t, holder, req("w", 10*time.Second))
	rb := req("w", 10*time.Second)
	wb := queued(t, b, rb)
	_, lost, _ := wb.State()
	m.Proxy.CutFor(time.Second)
	if err := holder.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	handedOver(t, b, wb, rb, 15*time.Second)
	select {
	case <-lost:
		t.Log("the watch was said lost, and came back")
	default:
		t.Log("the client's watch resumed after the cut without being said lost")
	}
}

// TestCloseBoundedWhileCutOff closes a Locker whose only member is cut off
// while a waiter waits and a cleanup is in flight: Close returns within
// its bound (2 s), whatever the client is still waiting for.
func TestCloseBoundedWhileCutOff(t *testing.T) {
	c := StartCluster(t, 3)
	m := c.Members[0]
	l, err := etcdlockNew(c.ClientOf(t, m.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	held, err := l.TryAcquire(ctx, "close", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "close", 10*time.Second)
		waiting <- err
	}()
	time.Sleep(300 * time.Millisecond)
	m.Proxy.Block()
	defer m.Proxy.Unblock()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_ = held.Release(short) // cut off: its cleanup goes on in the background
	start := time.Now()
	l.Close()
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Close took %v while the member was cut off, past its 2s bound", d)
	} else {
		t.Logf("Close returned in %v", d.Round(time.Millisecond))
	}
}
