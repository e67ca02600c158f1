package etcdtest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// keyBackFromRestore sets up a holder key that a restore brings back: a
// process (the returned backend) holds one resource, keep, whose key keeps
// its session's lease in use, and grants and releases r after a backup;
// another process then grants r 30 times; the cluster is restored from
// the backup with --bump-revision and --mark-compacted. The restored
// cluster holds the released key of r again, with its old create
// revision, on the lease the first process still keeps alive. It returns
// the first process, the second, the highest token granted before the
// restore, and a function that extends keep. With freeze, the first
// process's keep-alives are held back (Freeze) from before the restore.
func keyBackFromRestore(t *testing.T, c *Cluster, ttl time.Duration, freeze bool) (a, other *backend.Backend, high fence.Token, extend func()) {
	t.Helper()
	a = newBackend(t, c.Client(t))
	k := mustGrant(t, a, req("keep", ttl))
	first := mustGrant(t, a, req("r", ttl))
	path := c.Backup(t, 0)
	if err := a.Release(ctxFor(t, 5*time.Second), first.Hold); err != nil {
		t.Fatal(err)
	}
	other = newBackendAt(t, c.Client(t), a)
	high = first.Token
	for range 30 {
		g := mustGrant(t, other, req("r", ttl))
		high = max(high, g.Token)
		if err := other.Release(ctxFor(t, 5*time.Second), g.Hold); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("r's token released after the backup %d, highest before the restore %d", first.Token, high)
	// keep is held for the whole test: its session's lease is kept alive,
	// and so is the key the restore brings back on it.
	extend = func() {
		if _, err := a.Extend(ctxFor(t, 5*time.Second), k.Hold, ttl); err != nil {
			t.Logf("extend keep: %v", err)
		}
	}
	extend()
	if freeze {
		a.Freeze(false)
	}
	c.Restore(t, path, restoreBump)
	c.Leader(t)
	return a, other, high, extend
}

// noKeyOfBefore fails t if a holder key of resource r created at or below
// the token high stands.
func noKeyOfBefore(t *testing.T, cli *clientv3.Client, b *backend.Backend, high fence.Token) {
	t.Helper()
	get, err := cli.Get(ctxFor(t, 5*time.Second), b.Prefix()+"{r}/h/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range get.Kvs {
		if backend.TokenBase+fence.Token(kv.CreateRevision) <= high {
			t.Errorf("key %s (holder %s, create revision %d) of before the restore still stands", kv.Key, kv.Value, kv.CreateRevision)
		}
	}
}

// TestRestoredKeyOnReusedSlot: after a restore with the bump, the process
// whose released key came back tries r again, and its try takes the slot
// of that key. The try must not take the key as its own: with a queued
// try, its put would keep the key's create revision and grant the token
// of a grant made before the backup (below the 30 issued after it); with
// a plain try, the key of another holder id on its slot would refuse the
// try, and hold the lock for nobody. Both failed before the backend
// retired such a slot. The first process's keep-alives are held back
// (Freeze) from before the restore until the try's reply, so that the try, not a
// keep-alive tick's sweep, finds the key.
func TestRestoredKeyOnReusedSlot(t *testing.T) {
	for _, queue := range []bool{true, false} {
		name := map[bool]string{true: "queued", false: "plain"}[queue]
		t.Run(name, func(t *testing.T) {
			c := StartCluster(t, 1)
			const ttl = 10 * time.Second
			a, _, high, extend := keyBackFromRestore(t, c, ttl, true)
			r := req("r", ttl)
			r.Queue = queue
			o, err := a.Try(ctxFor(t, 5*time.Second), r)
			a.Thaw()
			extend()
			if err != nil {
				t.Fatalf("try after the restore: %v", err)
			}
			if !o.Granted {
				t.Fatalf("try after the restore: not granted (place %d), though nobody holds r", o.Place)
			}
			if o.Token <= high {
				t.Fatalf("granted token %d after a restore with the bump, at or below %d issued before it", o.Token, high)
			}
			noKeyOfBefore(t, c.Client(t), a, high)
		})
	}
}

// TestRestoredKeyNobodyOwnsIsDeleted: after a restore with the bump, a
// key the restore brought back on a lease a process keeps alive (for its
// other keys) holds the lock for nobody until that process deletes it.
// Another process tries r until it is granted: the first process's
// keep-alive ticks (every fifth of the TTL) find the key on their lease,
// owned by no acquisition, and delete it. Before they did, r stayed held
// for as long as the first process held keep (here, the whole test).
func TestRestoredKeyNobodyOwnsIsDeleted(t *testing.T) {
	c := StartCluster(t, 1)
	const ttl = 10 * time.Second
	a, other, high, extend := keyBackFromRestore(t, c, ttl, false)
	// A bound far above a keep-alive interval and a round trip, even on
	// a loaded machine; keep stays held until then.
	deadline := time.Now().Add(25 * time.Second)
	for next := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(next) {
			extend()
			next = time.Now().Add(ttl / 5)
		}
		o, err := other.Try(ctxFor(t, 5*time.Second), req("r", ttl))
		if err == nil && o.Granted {
			if o.Token <= high {
				t.Fatalf("granted token %d after a restore with the bump, at or below %d issued before it", o.Token, high)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("r not granted within 25 s of the restore (last try: %+v, %v): a key of before holds it for nobody", o, err)
		}
	}
	noKeyOfBefore(t, c.Client(t), a, high)
}
