package etcdtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// A try whose reply is lost may still have its put applied by the cluster
// later, after the deletion the backend sent since. These tests make that
// happen on purpose: the try's transaction is held back unsent while the
// try reports its reply lost, and the test sends it afterwards, as a
// member that applies a request its client gave up on would.

var errLostOnPurpose = errors.New("reply lost on purpose")

// holdNextTxn makes b's next transaction (a Try's or an Abandon's) be held
// back and fail as if its reply had been lost; send sends it and returns
// the key the last read of the transaction found (a queued try's reads
// its own key, which its put always leaves), or nil.
func holdNextTxn(t *testing.T, b *backend.Backend) (send func() *mvccpb.KeyValue) {
	t.Helper()
	var mu sync.Mutex
	var held clientv3.Txn
	b.SendTxn = func(ctx context.Context, txn clientv3.Txn) (*clientv3.TxnResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if held == nil {
			held = txn
			return nil, errLostOnPurpose
		}
		return txn.Commit()
	}
	return func() *mvccpb.KeyValue {
		t.Helper()
		mu.Lock()
		txn := held
		mu.Unlock()
		if txn == nil {
			t.Fatal("no transaction was held back")
		}
		resp, err := txn.Commit()
		if err != nil {
			t.Fatalf("sending the held transaction: %v", err)
		}
		if len(resp.Responses) == 0 {
			return nil
		}
		rr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
		if rr == nil || len(rr.Kvs) == 0 {
			return nil
		}
		return rr.Kvs[0]
	}
}

// firstKey reads resource's first holder key under b's prefix.
func firstKey(t *testing.T, cli *clientv3.Client, b *backend.Backend, resource string) *mvccpb.KeyValue {
	t.Helper()
	get, err := cli.Get(ctxFor(t, 5*time.Second), b.Prefix()+"{"+resource+"}/h/", clientv3.WithFirstCreate()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) == 0 {
		return nil
	}
	return get.Kvs[0]
}

// TestLatePutOfLostTryDeleted loses the reply of a queued try and sends
// its put after the try returned, while another acquisition of the same
// Locker holds the lock: the key that landed late is deleted by the
// sweep well within lateApply, the other acquisition's key (on a slot of
// its own) stands untouched, and a later grant's token is above every
// earlier key's.
func TestLatePutOfLostTryDeleted(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	send := holdNextTxn(t, b)
	const res = "late"
	// A 2s lease: its session's keep-alive ticks, which sweep, come every
	// 400ms.
	ra := req(res, 2*time.Second)
	ra.Queue = true
	if out, err := b.Try(ctxFor(t, 30*time.Second), ra); !errors.Is(err, errLostOnPurpose) {
		t.Fatalf("Try whose reply was lost: granted=%v err=%v, want the loss", out.Granted, err)
	}
	rb := req(res, 10*time.Second)
	hb := mustGrant(t, b, rb)
	late := send()
	if late == nil || string(late.Value) != ra.Holder {
		t.Fatalf("the late put's key holds %q, want the lost try's holder", late.Value)
	}
	bKey := firstKey(t, cli, b, res)
	if bKey == nil || string(bKey.Value) != rb.Holder || backend.TokenBase+fence.Token(bKey.CreateRevision) != hb.Token {
		t.Fatalf("the holder's key after the late put: %v, want %q's of token %d", bKey, rb.Holder, hb.Token)
	}
	if string(bKey.Key) == string(late.Key) {
		t.Fatalf("the grant took the slot %q of a try whose reply was lost", late.Key)
	}
	// (a) The sweep deletes the key that landed late.
	deadline := time.Now().Add(5 * time.Second)
	for {
		get, err := cli.Get(ctxFor(t, 5*time.Second), string(late.Key), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if get.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key %q a lost try put late still stands 5s after it landed", late.Key)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// (b) The other acquisition's key stands, as it was.
	if k := firstKey(t, cli, b, res); k == nil || string(k.Key) != string(bKey.Key) || string(k.Value) != rb.Holder || k.CreateRevision != bKey.CreateRevision {
		t.Fatalf("the holder's key after the sweep: %v, want %v", k, bKey)
	}
	if d, err := b.TTL(ctxFor(t, 5*time.Second), hb.Hold); err != nil || d <= 0 {
		t.Fatalf("the holder's TTL after the sweep: %v %v", d, err)
	}
	// (c) A later grant's token is above every earlier key's.
	if err := b.Release(ctxFor(t, 5*time.Second), hb.Hold); err != nil {
		t.Fatal(err)
	}
	hc := mustGrant(t, b, req(res, 5*time.Second))
	if hc.Token <= hb.Token || hc.Token <= backend.TokenBase+fence.Token(late.CreateRevision) {
		t.Fatalf("later grant's token %d, after %d and the late key's %d", hc.Token, hb.Token, backend.TokenBase+fence.Token(late.CreateRevision))
	}
	if err := b.Release(ctxFor(t, 5*time.Second), hc.Hold); err != nil {
		t.Fatal(err)
	}
}

// TestSlotOfLostTryNeverReused lets a lost try's put land after the
// backend stopped looking for it (past lateApply, shortened here): its
// slot must not have been given to another acquisition, whose key the
// put would otherwise take over (a put on a standing key keeps its create
// revision and replaces its holder id), and the key it leaves is deleted
// by its session's watch of late puts.
func TestSlotOfLostTryNeverReused(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	b.LateApply = 300 * time.Millisecond
	send := holdNextTxn(t, b)
	const res = "retired"
	ra := req(res, 2*time.Second)
	ra.Queue = true
	if _, err := b.Try(ctxFor(t, 30*time.Second), ra); !errors.Is(err, errLostOnPurpose) {
		t.Fatalf("Try whose reply was lost: %v, want the loss", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Tracked(res, ra.Holder) {
		if time.Now().After(deadline) {
			t.Fatal("the lost try's entry is still kept 10s after its reply was lost")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rb := req(res, 10*time.Second)
	hb := mustGrant(t, b, rb)
	bKey := firstKey(t, cli, b, res)
	// A grant of another resource keeps the lost try's session (2s
	// leases) in use, as a busy process's keys would: it is then not
	// revoked as idle, which would take a late key with it.
	keep := mustGrant(t, b, req(res+"-keep", 2*time.Second))
	late := send()
	if late == nil {
		t.Fatal("the late put left no key")
	}
	t.Cleanup(func() { _, _ = cli.Delete(context.Background(), string(late.Key)) })
	if string(late.Key) == string(bKey.Key) {
		t.Errorf("the grant took the slot %q of a try whose reply was lost", late.Key)
	}
	k := firstKey(t, cli, b, res)
	if k == nil || string(k.Key) != string(bKey.Key) || string(k.Value) != rb.Holder || k.CreateRevision != bKey.CreateRevision {
		t.Fatalf("the holder's key after the late put: %v, want %v", k, bKey)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), hb.Hold); err != nil {
		t.Fatalf("release of the holder after the late put: %v", err)
	}
	// The put landed after the backend stopped looking for it as an
	// entry: its session's watch of late puts still deletes it, on one of
	// the next keep-alive ticks (every 400ms for a 2s lease), rather than
	// leaving the lock taken for as long as the session lives.
	deadline = time.Now().Add(3 * time.Second)
	for {
		if _, err := b.Extend(ctxFor(t, 5*time.Second), keep.Hold, 2*time.Second); err != nil {
			t.Fatalf("extending the grant that keeps the session in use: %v", err)
		}
		get, err := cli.Get(ctxFor(t, 5*time.Second), string(late.Key))
		if err != nil {
			t.Fatal(err)
		}
		if len(get.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the put that landed past lateApply still stands 3s later: %s", late.Key)
		}
		time.Sleep(50 * time.Millisecond)
	}
	hc := mustGrant(t, b, req(res, 5*time.Second))
	if hc.Token <= hb.Token || hc.Token <= backend.TokenBase+fence.Token(late.CreateRevision) {
		t.Fatalf("later grant's token %d, after %d and the late key's %d", hc.Token, hb.Token, backend.TokenBase+fence.Token(late.CreateRevision))
	}
	if err := b.Release(ctxFor(t, 5*time.Second), hc.Hold); err != nil && !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatal(err)
	}
}

// TestLateDeletionSparesReusedSlot loses the reply of an Abandon and lets
// its deletion land after the slot's key was deleted at its end and the
// slot given to the next acquisition: the deletion compares the holder
// id, so the next acquisition's key stands.
func TestLateDeletionSparesReusedSlot(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	const res = "undead"
	ra := req(res, 5*time.Second)
	mustGrant(t, b, ra)
	aKey := firstKey(t, cli, b, res)
	send := holdNextTxn(t, b)
	if err := b.Abandon(ctxFor(t, 5*time.Second), res, ra.Holder, ""); !errors.Is(err, errLostOnPurpose) {
		t.Fatalf("Abandon whose reply was lost: %v, want the loss", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Tracked(res, ra.Holder) {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned key is still kept 10s after its deletion's reply was lost")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rb := req(res, 10*time.Second)
	hb := mustGrant(t, b, rb)
	bKey := firstKey(t, cli, b, res)
	if string(bKey.Key) != string(aKey.Key) {
		t.Fatalf("the next grant put %q, not the freed slot %q", bKey.Key, aKey.Key)
	}
	send()
	if k := firstKey(t, cli, b, res); k == nil || string(k.Value) != rb.Holder || k.CreateRevision != bKey.CreateRevision {
		t.Fatalf("the next grant's key after the late deletion: %v, want %v", k, bKey)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), hb.Hold); err != nil {
		t.Fatal(err)
	}
}

// TestLateReleaseSparesNextKey loses the reply of a release, whose
// deletion of its slot's key compares nothing, and lands the deletion
// after the key's end deleted the key and the next acquisition was
// granted: the slot of a release whose reply was lost is never used
// again, so the next grant's key stands.
func TestLateReleaseSparesNextKey(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	const res = "late-release"
	ra := req(res, 2*time.Second)
	ha := mustGrant(t, b, ra)
	aKey := firstKey(t, cli, b, res)
	var mu sync.Mutex
	var held string
	b.SendDelete = func(ctx context.Context, key string) (*clientv3.DeleteResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if held == "" {
			held = key
			return nil, errLostOnPurpose
		}
		return cli.Delete(ctx, key)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), ha.Hold); !errors.Is(err, lockbackend.ErrReplyLost) || !errors.Is(err, errLostOnPurpose) {
		t.Fatalf("Release whose reply was lost: %v, want the loss", err)
	}
	waitUntracked(t, b, res, ra.Holder)
	next := grantOnAnotherSlot(t, cli, b, res, aKey, "the slot of a release whose reply was lost")
	if _, err := cli.Delete(ctxFor(t, 5*time.Second), held); err != nil {
		t.Fatal(err)
	}
	next.stands("the late deletion")
}

// TestReleaseInFlightKeepsSlot holds a release's deletion back while the
// key goes another way (its end passes, or a second release of the grant
// deletes it) and the next acquisition is granted: a slot is not freed
// while any release of it is in flight, so the next grant is on another
// slot and its key stands after the held deletion lands; that release
// then reports the lock not held.
func TestReleaseInFlightKeepsSlot(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		// gone makes the key go while the first release is held.
		gone func(t *testing.T, b *backend.Backend, r *lockbackend.Request, h lockbackend.Outcome)
	}{
		{"key end", time.Second, func(t *testing.T, b *backend.Backend, r *lockbackend.Request, _ lockbackend.Outcome) {
			waitUntracked(t, b, r.Resource, r.Holder)
		}},
		{"second release", 10 * time.Second, func(t *testing.T, b *backend.Backend, _ *lockbackend.Request, h lockbackend.Outcome) {
			if err := b.Release(ctxFor(t, 5*time.Second), h.Hold); err != nil {
				t.Fatalf("the second release: %v", err)
			}
		}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			c := sharedCluster(t)
			cli := c.Client(t)
			b := newBackend(t, cli)
			res := "release-in-flight-" + strings.ReplaceAll(tc.name, " ", "-")
			ra := req(res, tc.ttl)
			ha := mustGrant(t, b, ra)
			aKey := firstKey(t, cli, b, res)
			started, land := holdFirstDelete(b, cli)
			errc := make(chan error, 1)
			go func() { errc <- b.Release(ctxFor(t, 30*time.Second), ha.Hold) }()
			<-started
			tc.gone(t, b, ra, ha)
			next := grantOnAnotherSlot(t, cli, b, res, aKey, "the slot of a release in flight")
			land()
			if err := <-errc; !errors.Is(err, lockbackend.ErrNotHeld) {
				t.Fatalf("the held release, landing after the %s: %v, want ErrNotHeld", tc.name, err)
			}
			next.stands("the held release's deletion")
		})
	}
}

// holdFirstDelete holds b's first release deletion back: started closes
// when it is sent, and land lets it go on to the cluster.
func holdFirstDelete(b *backend.Backend, cli *clientv3.Client) (started <-chan struct{}, land func()) {
	s, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.SendDelete = func(ctx context.Context, key string) (*clientv3.DeleteResponse, error) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(s)
			<-gate
		}
		return cli.Delete(ctx, key)
	}
	return s, func() { close(gate) }
}

// nextGrant is a grant made while a deletion of an earlier key of the
// resource was held back.
type nextGrant struct {
	t      *testing.T
	cli    *clientv3.Client
	b      *backend.Backend
	res    string
	holder string
	key    *mvccpb.KeyValue
	out    lockbackend.Outcome
}

// grantOnAnotherSlot grants res to a new holder on b and fails the test if
// its key is on the slot of was (what says whose slot that is).
func grantOnAnotherSlot(t *testing.T, cli *clientv3.Client, b *backend.Backend, res string, was *mvccpb.KeyValue, what string) nextGrant {
	t.Helper()
	r := req(res, 10*time.Second)
	out := mustGrant(t, b, r)
	k := firstKey(t, cli, b, res)
	if string(k.Key) == string(was.Key) {
		t.Fatalf("the next grant put %q, %s", k.Key, what)
	}
	return nextGrant{t: t, cli: cli, b: b, res: res, holder: r.Holder, key: k, out: out}
}

// stands fails the test unless g's key still stands after after, and then
// releases g.
func (g nextGrant) stands(after string) {
	g.t.Helper()
	if k := firstKey(g.t, g.cli, g.b, g.res); k == nil || string(k.Value) != g.holder || k.CreateRevision != g.key.CreateRevision {
		g.t.Fatalf("the next grant's key after %s: %v, want %v", after, k, g.key)
	}
	if err := g.b.Release(ctxFor(g.t, 5*time.Second), g.out.Hold); err != nil {
		g.t.Fatal(err)
	}
}

// waitUntracked waits up to 10s for b to forget holder's entry of
// resource.
func waitUntracked(t *testing.T, b *backend.Backend, resource, holder string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.Tracked(resource, holder) {
		if time.Now().After(deadline) {
			t.Fatalf("%q's entry of %q is still kept after 10s", holder, resource)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLateReleaseControlReusedSlot is TestLateReleaseSparesNextKey's
// control, deterministic: with the broken variant that puts the slot of a
// release whose reply was lost back on the free list once the key's end
// deleted the key, the next grant takes that slot, and the late deletion
// deletes its key while its holder still believes in it. The lock model
// runs the same broken variant (TestLockModelEtcdControl), where it is
// caught only when a run's timing lines the steps up.
func TestLateReleaseControlReusedSlot(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	b.KeepSlotOfLostRelease = true
	const res = "late-release-control"
	ra := req(res, 2*time.Second)
	ha := mustGrant(t, b, ra)
	aKey := firstKey(t, cli, b, res)
	var mu sync.Mutex
	var held string
	b.SendDelete = func(ctx context.Context, key string) (*clientv3.DeleteResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if held == "" {
			held = key
			return nil, errLostOnPurpose
		}
		return cli.Delete(ctx, key)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), ha.Hold); !errors.Is(err, lockbackend.ErrReplyLost) {
		t.Fatalf("Release whose reply was lost: %v, want the loss", err)
	}
	waitUntracked(t, b, res, ra.Holder)
	r := req(res, 10*time.Second)
	sent := time.Now()
	out := mustGrant(t, b, r)
	k := firstKey(t, cli, b, res)
	if string(k.Key) != string(aKey.Key) {
		t.Fatalf("the broken variant's next grant put %q, not the slot %q of the lost release: the control shows nothing", k.Key, aKey.Key)
	}
	if _, err := cli.Delete(ctxFor(t, 5*time.Second), held); err != nil {
		t.Fatal(err)
	}
	if k := firstKey(t, cli, b, res); k != nil && string(k.Value) == r.Holder {
		t.Fatalf("the late deletion left the next grant's key %v: the control shows nothing", k)
	}
	if left := time.Until(sent.Add(out.Known)); left <= 0 {
		t.Fatalf("the next grant's belief had ended when the late deletion landed: the control shows nothing")
	} else {
		t.Logf("control: the late deletion took the next grant's key with %v of its belief left", left.Round(time.Millisecond))
	}
}
