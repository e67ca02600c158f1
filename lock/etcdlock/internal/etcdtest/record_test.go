package etcdtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// TestRecordBesideTheLock checks the record the election keeps beside the
// lock: only the grant that holds the lock writes it, a reader sees it only
// while that grant holds, a watcher hears each write, an older grant cannot
// overwrite a newer one's, and the record goes with the lock.
func TestRecordBesideTheLock(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	ctx := ctxFor(t, time.Minute)
	watch := b.WatchRecord(ctx, "e")
	if _, err := b.ReadRecord(ctx, "e"); !errors.Is(err, lockbackend.ErrNoRecord) {
		t.Fatalf("ReadRecord of a free lock: %v, want ErrNoRecord", err)
	}
	ra := req("e", 5*time.Second)
	a := mustGrant(t, b, ra)
	fa := fence.Fence{Resource: "e", Token: a.Token, Holder: ra.Holder}
	if _, err := b.ReadRecord(ctx, "e"); !errors.Is(err, lockbackend.ErrNoRecord) {
		t.Fatalf("ReadRecord before the holder wrote: %v, want ErrNoRecord", err)
	}
	if err := b.PutRecord(ctx, fa, "leader-a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRecord(ctx, fa, "leader-a", time.Second); err != nil {
		t.Fatalf("PutRecord again (a retry): %v", err)
	}
	rec, err := b.ReadRecord(ctx, "e")
	if err != nil || rec.Value != "leader-a" || rec.Token != a.Token {
		t.Fatalf("ReadRecord: %+v %v", rec, err)
	}
	select {
	case w := <-watch:
		if w.Value != "leader-a" || w.Token != a.Token {
			t.Fatalf("watched %+v", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch heard nothing")
	}
	if err := b.KeepRecord(ctx, fa, time.Second); err != nil {
		t.Fatalf("KeepRecord: %v", err)
	}
	// A fence that holds nothing writes nothing.
	forged := fence.Fence{Resource: "e", Token: a.Token + 1000, Holder: fence.NewHolder()}
	if err := b.PutRecord(ctx, forged, "forged", time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("PutRecord of a fence that holds nothing: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, a.Hold); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadRecord(ctx, "e"); !errors.Is(err, lockbackend.ErrNoRecord) {
		t.Fatalf("ReadRecord after the release: %v, want ErrNoRecord", err)
	}
	if get, err := cli.Get(ctx, b.Prefix()+"{e}/r", clientv3.WithCountOnly()); err != nil || get.Count != 0 {
		t.Fatalf("the record after its grant's release: %v keys, err %v; want it deleted with the lock", get.Count, err)
	}
	if err := b.PutRecord(ctx, fa, "late", time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("PutRecord after the release: %v, want ErrNotHeld", err)
	}
	if err := b.KeepRecord(ctx, fa, time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("KeepRecord after the release: %v, want ErrNotHeld", err)
	}
	rb := req("e", 5*time.Second)
	bo := mustGrant(t, b, rb)
	fb := fence.Fence{Resource: "e", Token: bo.Token, Holder: rb.Holder}
	if err := b.PutRecord(ctx, fb, "leader-b", time.Second); err != nil {
		t.Fatal(err)
	}
	if rec, err := b.ReadRecord(ctx, "e"); err != nil || rec.Value != "leader-b" || rec.Token <= a.Token {
		t.Fatalf("ReadRecord of the second term: %+v %v", rec, err)
	}
	// A record that names a newer grant (written here by hand, since etcd's
	// tokens never go back) is not overwritten by an older one.
	newer := bo.Token + 5
	if _, err := cli.Put(ctx, b.Prefix()+"{e}/r", fmt.Sprintf("%016d\nnewer", int64(newer))); err != nil {
		t.Fatal(err)
	}
	var nre *lockbackend.NewerRecordError
	if err := b.PutRecord(ctx, fb, "leader-b again", time.Second); !errors.As(err, &nre) || nre.Token != newer {
		t.Fatalf("PutRecord under a newer record: %v, want a NewerRecordError naming %d", err, newer)
	}
}
