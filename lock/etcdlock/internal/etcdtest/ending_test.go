package etcdtest

import (
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// A key's end is the backend's to keep: once it has passed and the
// deletion is decided, nothing may believe in the key as it stands, even
// while the deletion has not landed; and the deletion must not take a key
// that a queued waiter's refresh put again meanwhile. Both tests hold the
// deletion back (BeforeEndDelete) to open the window a loaded machine
// opens now and then.

// slowEndDelete makes b's deletions at a key's end wait until the returned
// release is called; decided receives once per decision.
func slowEndDelete(t *testing.T, b *backend.Backend) (decided <-chan struct{}, release func()) {
	d := make(chan struct{}, 16)
	gate := make(chan struct{})
	var once sync.Once
	b.BeforeEndDelete = func() {
		select {
		case d <- struct{}{}:
		default:
		}
		<-gate
	}
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return d, release
}

// TestExtendAfterEndRefused extends a grant whose end passed while its
// deletion is on its way: the extension must be refused, though a read
// would still find the key, since the key is gone once the deletion lands.
func TestExtendAfterEndRefused(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	decided, release := slowEndDelete(t, b)
	r := req("x", 300*time.Millisecond)
	out := mustGrant(t, b, r)
	select {
	case <-decided:
	case <-time.After(10 * time.Second):
		t.Fatal("the key's deletion at its end was not decided within 10s")
	}
	known, err := b.Extend(ctxFor(t, 5*time.Second), out.Hold, 2*time.Second)
	release()
	if !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("Extend after the key's end: known %v, err %v; want ErrNotHeld", known, err)
	}
}

// TestRefreshAtEndKeepsKey lets a queued waiter's entry reach its end and
// holds its deletion back; the waiter's refresh then puts the key again
// and, its holder gone, is granted the lock. The deletion, landing after,
// must leave that key standing for as long as the grant believes it.
func TestRefreshAtEndKeepsKey(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	a := newBackend(t, cli)
	ra := req("y", 30*time.Second)
	ha := mustGrant(t, a, ra)
	b := newBackendAt(t, c.Client(t), a)
	decided, release := slowEndDelete(t, b)
	rw := req("y", 2*time.Second)
	rw.Queue = true
	if out, err := b.Try(ctxFor(t, 10*time.Second), rw); err != nil || out.Granted || out.Ref == 0 {
		t.Fatalf("queueing try: granted=%v ref=%d err=%v", out.Granted, out.Ref, err)
	}
	select {
	case <-decided: // the entry's end (QueueLife) passed
	case <-time.After(15 * time.Second):
		t.Fatal("the queued key's deletion at its end was not decided within 15s")
	}
	if err := a.Release(ctxFor(t, 5*time.Second), ha.Hold); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	out, err := b.Try(ctxFor(t, 10*time.Second), rw)
	if err != nil || !out.Granted {
		t.Fatalf("refresh after the holder left: granted=%v err=%v", out.Granted, err)
	}
	believed := sent.Add(out.Known)
	release()
	reads := 0
	for time.Now().Before(believed.Add(-50 * time.Millisecond)) {
		get, err := cli.Get(ctxFor(t, 5*time.Second), b.Prefix()+"{y}/h/", clientv3.WithFirstCreate()...)
		if err != nil {
			t.Fatal(err)
		}
		if !time.Now().Before(believed) {
			break
		}
		if len(get.Kvs) == 0 || string(get.Kvs[0].Value) != rw.Holder {
			t.Fatalf("the grant's key is gone (or not first) %v before the end of its validity", time.Until(believed))
		}
		reads++
		time.Sleep(20 * time.Millisecond)
	}
	if reads == 0 {
		t.Fatal("no read was made while the grant was believed")
	}
	if err := b.Release(ctxFor(t, 5*time.Second), out.Hold); err != nil {
		t.Fatal(err)
	}
}
