package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// lostOf is the backend's signal that no belief in a grant may last.
func lostOf(h lockbackend.Hold) <-chan struct{} {
	return h.(interface{ Lost() <-chan struct{} }).Lost()
}

// TestRevokedLeaseEndsEveryBelief revokes, from another client, the etcd
// lease shown on one key of a process's: every lock of that process goes
// with it (its grants share the lease), and another process is granted
// at once. Every grant of the first process must be known lost within a
// keep-alive interval (a fifth of the TTL) and one attempt of the
// keep-alive (as long again) after the revoke, and Extend refuses.
func TestRevokedLeaseEndsEveryBelief(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	b := newBackend(t, cli)
	const ttl = 5 * time.Second
	var holds []lockbackend.Outcome
	for i := range 3 {
		holds = append(holds, mustGrant(t, b, req(fmt.Sprint("rv", i), ttl)))
	}
	ctx := ctxFor(t, 30*time.Second)
	get, err := cli.Get(ctx, b.Prefix()+"{rv0}/h/", clientv3.WithPrefix())
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("the holder's key: %v %v", get, err)
	}
	other := c.Client(t)
	revoked := time.Now()
	if _, err := other.Revoke(ctx, clientv3.LeaseID(get.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	b2 := newBackendAt(t, other, b)
	g := mustGrant(t, b2, req("rv0", ttl))
	granted := time.Since(revoked)
	bound := 2*ttl/5 + 2*time.Second // two intervals and a round trip, on a loaded machine
	for i, h := range holds {
		select {
		case <-lostOf(h.Hold):
		case <-time.After(time.Until(revoked.Add(bound))):
			t.Fatalf("grant %d still believed %v after its lease was revoked (another process was granted after %v)",
				i, time.Since(revoked).Round(time.Millisecond), granted.Round(time.Millisecond))
		}
	}
	t.Logf("another process granted %v after the revoke; every belief ended %v after it (bound %v)",
		granted.Round(time.Millisecond), time.Since(revoked).Round(time.Millisecond), bound)
	if g.Token <= holds[0].Token {
		t.Fatalf("token %d after %d", g.Token, holds[0].Token)
	}
	for _, h := range holds[1:] {
		if _, err := b.Extend(ctx, h.Hold, ttl); !errors.Is(err, lockbackend.ErrNotHeld) {
			t.Fatalf("Extend after the revoke: %v, want ErrNotHeld", err)
		}
	}
}

// TestClosedLockerGrantsNoLease makes a Locker, closes it, and then tries
// with it: Acquire and TryAcquire are refused at once (an error matching
// fence.ErrInvalid), and the cluster holds no lease more than before.
func TestClosedLockerGrantsNoLease(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	l, err := etcdlockNew(cli, lock.WithPrefix("fk-"+fence.NewHolder()[:8]+":"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	before := leaseIDs(t, ctx, cli)
	l.Close()
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := l.Acquire(actx, "closed", 20*time.Second); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Acquire on a closed Locker: %v, want an error matching fence.ErrInvalid", err)
	}
	for range 20 {
		if _, err := l.TryAcquire(ctx, "closed", 20*time.Second); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("TryAcquire on a closed Locker: %v, want an error matching fence.ErrInvalid", err)
		}
	}
	var added int
	for id := range leaseIDs(t, ctx, cli) {
		if !before[id] {
			added++
		}
	}
	// Other tests share the cluster: a lease of theirs may have come
	// meanwhile, but not one per try.
	if added > 3 {
		t.Fatalf("a closed Locker's 21 tries left %d leases on the cluster", added)
	}
}

func leaseIDs(t *testing.T, ctx context.Context, cli *clientv3.Client) map[clientv3.LeaseID]bool {
	t.Helper()
	resp, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		m[l.ID] = true
	}
	return m
}

// TestRevokedLeaseClosesDone is the revoke through the portable Lease: a
// Locker holds three locks without AutoRenew, their shared etcd lease is
// revoked from another client, and every Lease's Done must close (its
// Validity 0, its Err matching lock.ErrNotHeld) within the keep-alive's
// bound, long before the leases' own end. Before package lock listened to
// the backend's loss signal, Done closed only at the TTL (10 s here).
func TestRevokedLeaseClosesDone(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	prefix := "fk-" + fence.NewHolder()[:8] + ":"
	l, err := etcdlockNew(cli, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := ctxFor(t, 40*time.Second)
	const ttl = 10 * time.Second
	var leases []*lock.Lease
	for i := range 3 {
		lease, err := l.TryAcquire(ctx, fmt.Sprint("done", i), ttl)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	done := leases[0].Done() // watched before the revoke; the others after
	get, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil || len(get.Kvs) == 0 || get.Kvs[0].Lease == 0 {
		t.Fatalf("the Locker's keys: %v %v", get, err)
	}
	revoked := time.Now()
	if _, err := c.Client(t).Revoke(ctx, clientv3.LeaseID(get.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	bound := 2*ttl/5 + 2*time.Second // two keep-alive intervals and a round trip, on a loaded machine
	select {
	case <-done:
	case <-time.After(time.Until(revoked.Add(bound))):
		t.Fatalf("Done still open %v after the lease was revoked (bound %v, TTL %v)", time.Since(revoked).Round(time.Millisecond), bound, ttl)
	}
	t.Logf("Done closed %v after the revoke (bound %v, TTL %v)", time.Since(revoked).Round(time.Millisecond), bound, ttl)
	for i, lease := range leases {
		select {
		case <-lease.Done():
		case <-time.After(time.Until(revoked.Add(bound))):
			t.Fatalf("lease %d: Done still open %v after the revoke", i, time.Since(revoked).Round(time.Millisecond))
		}
		if v := lease.Validity(); v != 0 {
			t.Errorf("lease %d: Validity %v after the revoke, want 0", i, v)
		}
		if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("lease %d: Err %v, want lock.ErrNotHeld", i, err)
		}
	}
}
