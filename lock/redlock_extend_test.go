package lock_test

import (
	"context"
	"testing"
	"time"
)

// TestRedlockExtendCountsAQuorum: an extension's validity is what a
// quorum of nodes holds, not what the node holding longest does. One node
// of three keeps the key for a minute (as after an earlier extension that
// reached it alone); the others take the 2 s of this extension, so the
// lease may be believed about 2 s, never the minute that one node alone
// holds.
func TestRedlockExtendCountsAQuorum(t *testing.T) {
	ctx := context.Background()
	ns := startNodes(t, 3, 0)
	l := newRedlock(t, ns)
	lease, err := l.TryAcquire(ctx, "quorum-extend", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key := keysOf(l).LockKey("quorum-extend")
	if err := ns.direct[0].PExpire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	if err := lease.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	if v := lease.Validity(); v > ttl {
		t.Fatalf("Validity %v after an extension to %v that two nodes of three hold: a quorum holds it no longer than %v", v, ttl, ttl)
	}
}
