package etcdtest

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// TestSlotsReused checks that a Locker locking one resource again and
// again puts the same key, so that etcd's index of the directory does not
// grow with every grant, while acquisitions that stand at once take keys
// of their own; the holder id is the key's value.
func TestSlotsReused(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	names := map[string]bool{}
	for i := range 10 {
		r := req("s", 5*time.Second)
		out := mustGrant(t, b, r)
		k := firstKey(t, cli, b, "s")
		if k == nil || string(k.Value) != r.Holder {
			t.Fatalf("grant %d: first key %v, want one holding %q", i, k, r.Holder)
		}
		names[string(k.Key)] = true
		if err := b.Release(ctxFor(t, 5*time.Second), out.Hold); err != nil {
			t.Fatal(err)
		}
	}
	if len(names) != 1 {
		t.Fatalf("10 grants one after another put %d keys, want 1: %v", len(names), names)
	}
	// A holder and a queued waiter of the same Locker stand at once.
	ra := req("s", 5*time.Second)
	a := mustGrant(t, b, ra)
	rw := req("s", 5*time.Second)
	rw.Queue = true
	if out, err := b.Try(ctxFor(t, 5*time.Second), rw); err != nil || out.Granted || out.Ref == 0 {
		t.Fatalf("queued try: granted=%v ref=%d err=%v", out.Granted, out.Ref, err)
	}
	get, err := cli.Get(ctxFor(t, 5*time.Second), b.Prefix()+"{s}/h/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 2 || string(get.Kvs[0].Key) == string(get.Kvs[1].Key) {
		t.Fatalf("a holder and a waiter: %d keys, want two of their own", len(get.Kvs))
	}
	if err := b.Abandon(ctxFor(t, 5*time.Second), "s", rw.Holder, ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
}

// TestFenceOfAnotherLocker checks the calls that take a fence or a holder
// id rather than a hold, made through a Locker that keeps no entry of the
// grant: they find its key by the resource's keys (its create revision
// and holder id), not by a name made from the holder id.
func TestFenceOfAnotherLocker(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	a := newBackend(t, cli)
	o := newBackendAt(t, c.Client(t), a)
	ctx := ctxFor(t, 30*time.Second)
	ra := req("f", 5*time.Second)
	ha := mustGrant(t, a, ra)
	fa := fence.Fence{Resource: "f", Token: ha.Token, Holder: ra.Holder}
	if err := o.PutRecord(ctx, fa, "from another Locker", time.Second); err != nil {
		t.Fatalf("PutRecord of another Locker's grant: %v", err)
	}
	if err := o.KeepRecord(ctx, fa, time.Second); err != nil {
		t.Fatalf("KeepRecord of another Locker's grant: %v", err)
	}
	if rec, err := a.ReadRecord(ctx, "f"); err != nil || rec.Value != "from another Locker" || rec.Token != ha.Token {
		t.Fatalf("ReadRecord: %+v %v", rec, err)
	}
	wrong := fa
	wrong.Holder = fence.NewHolder()
	if err := o.PutRecord(ctx, wrong, "wrong holder", time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("PutRecord of the grant's token under another holder id: %v, want ErrNotHeld", err)
	}
	if err := o.KeepRecord(ctx, wrong, time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("KeepRecord of the grant's token under another holder id: %v, want ErrNotHeld", err)
	}
	// Abandon through the other Locker deletes the grant's key (found by
	// its value), and nothing of another holder's.
	if err := o.Abandon(ctx, "f", fence.NewHolder(), ""); err != nil {
		t.Fatal(err)
	}
	if k := firstKey(t, cli, a, "f"); k == nil || string(k.Value) != ra.Holder {
		t.Fatalf("after abandoning an unknown holder: first key %v, want %q's", k, ra.Holder)
	}
	if err := o.Abandon(ctx, "f", ra.Holder, ""); err != nil {
		t.Fatal(err)
	}
	if k := firstKey(t, cli, a, "f"); k != nil {
		t.Fatalf("after abandoning the holder: first key %v, want none", k)
	}
	if err := a.Release(ctx, ha.Hold); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("release after the key was abandoned: %v, want ErrNotHeld", err)
	}
}

// TestExtendMoveKeepsHolder checks that an extension longer than the
// key's lease, which moves the key onto a longer lease, keeps the holder
// id as its value: every later deletion compares it, so a move that lost
// it would leave a grant that its own release cannot delete.
func TestExtendMoveKeepsHolder(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	r := req("move", 2*time.Second)
	out := mustGrant(t, b, r)
	if _, err := b.Extend(ctxFor(t, 5*time.Second), out.Hold, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	k := firstKey(t, cli, b, "move")
	if k == nil || string(k.Value) != r.Holder {
		t.Fatalf("after the move the first key is %v, want one holding %q", k, r.Holder)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), out.Hold); err != nil {
		t.Fatalf("release after the move: %v", err)
	}
	if k := firstKey(t, cli, b, "move"); k != nil {
		t.Fatalf("after the release a key stands: %s", k.Key)
	}
}
