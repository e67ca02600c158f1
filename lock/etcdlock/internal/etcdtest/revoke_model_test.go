package etcdtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// The lock model on etcd with an external revoke: another client revokes
// the etcd lease under the lock's holder's key at random times, which
// ends on the server every grant of that holder's Locker standing on it.
// The promise check excuses the Locker's beliefs in them for the
// backend's stated detection bound (revokeBound), and no longer: a
// Locker that ignores the loss is believed past it and rejected.

// revokeRTT is the round trip allowance of the detection bound: the
// keep-alive that finds the lease gone is sent within two intervals of
// the revoke (one to the tick, one more if the tick's attempt was in
// flight), and its reply, and the close of the Lost channel, come within
// this on a loaded machine running three members in one process.
const revokeRTT = time.Second

// revokeBound is the detection bound of a lease of secs seconds: two
// keep-alive intervals (a fifth of the TTL each) and the round trip.
func revokeBound(secs int64) time.Duration {
	return 2*time.Duration(secs)*time.Second/5 + revokeRTT
}

// etcdLongTTL is the TTL of the model's long leases in the revoke runs:
// a Locker that ignores a revoke believes such a lease for at least 4/5
// of it past the revoke (its session's last keep-alive is at most an
// interval old), 6.4s, well past the bound of 4.2s.
const etcdLongTTL = 8 * time.Second

// revokeHolder is the fault: it reads the lock's holder key, and revokes
// the lease it stands on from the watcher's client. For up to a second it
// waits for a holder of a long lease (etcdLongTTL), revoked early in its
// life, which a Locker that ignores the loss believes well past the bound;
// then it revokes whatever holder it read last. A Locker whose long lease
// it revoked is spared until the bound has passed and a little more: a
// revoke of another of its leases would excuse its beliefs again (every
// lease of a revoked Locker may have stood on the lease), and a Locker
// that ignores the loss would be believed past the first bound unjudged.
func (e *lockEtcd) revokeHolder(resource func() string) lockmodel.Fault {
	var mu sync.Mutex
	spared := map[int]time.Time{} // actor -> until
	sparedNow := func(holder string) bool {
		a, ok := e.actors.Load(holder)
		if !ok {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Before(spared[a.(int)])
	}
	return lockmodel.Fault{Name: "holder's lease revoked", Lose: func(ctx context.Context) (lockmodel.Loss, error) {
		dir := e.prefix + "{" + resource() + "}/h/"
		wait := time.Now().Add(time.Second)
		for {
			get, err := e.watcher.Get(ctx, dir, clientv3.WithFirstCreate()...)
			if err != nil {
				return lockmodel.Loss{}, err
			}
			if len(get.Kvs) == 0 {
				if time.Now().Before(wait) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				return lockmodel.Loss{}, nil
			}
			kv := get.Kvs[0]
			id := clientv3.LeaseID(kv.Lease)
			ttl, err := e.watcher.TimeToLive(ctx, id)
			if err != nil || ttl.GrantedTTL <= 0 {
				continue // gone meanwhile
			}
			long := time.Duration(ttl.GrantedTTL)*time.Second >= etcdLongTTL
			if spare := sparedNow(string(kv.Value)); spare || !long {
				if time.Now().Before(wait) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if spare {
					return lockmodel.Loss{}, nil
				}
			}
			if _, err := e.watcher.Revoke(ctx, id); err != nil {
				if errors.Is(err, rpctypes.ErrLeaseNotFound) {
					return lockmodel.Loss{}, nil
				}
				return lockmodel.Loss{}, err
			}
			l := lockmodel.Loss{Holder: string(kv.Value), Bound: revokeBound(ttl.GrantedTTL)}
			if a, ok := e.actors.Load(l.Holder); ok {
				l.Actor, l.ActorKnown = a.(int), true
				if long {
					mu.Lock()
					spared[l.Actor] = time.Now().Add(l.Bound + revokeSpare)
					mu.Unlock()
				}
			}
			return l, nil
		}
	}}
}

// longLeasesEnded is the model's count of long leases (Config.LongTTL)
// held to their end.
const longLeasesEnded = "long leases held to their end"

// revokeLongEvery is how many tries and waiting acquisitions there are per
// long lease in the revoke runs: a long lease is granted, and revoked,
// early in every run.
const revokeLongEvery = 3

// revokeSpare is how long past the bound the Locker of a revoked long
// lease is spared: its belief, if it ignored the loss, is judged by then.
const revokeSpare = time.Second

// trackedBackend tells its lockEtcd which actor's Locker sent each grant
// attempt: a revoke may end the lease under the key of an attempt whose
// reply never came (a waiter that gave up), and with it the other grants
// of that Locker on the lease.
type trackedBackend struct {
	*backend.Backend
	e     *lockEtcd
	actor int
}

func (b trackedBackend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	b.e.actors.Store(req.Holder, b.actor)
	return b.Backend.Try(ctx, req)
}

// revokeFloors are the revoke runs' floors: the promise check judged
// beliefs of a revoked Locker within the window, and a long lease was held
// to its end (the run goes on until one ended: one revoked early in its
// life, which a Locker that ignores the loss believes past the bound, is
// then judged past it).
func revokeFloors() map[string]int {
	f := etcdFloors()
	f[lockmodel.RevokeJudged] = 3
	f[longLeasesEnded] = 1
	delete(f, lockmodel.Anchor) // the workload makes few grants beside long leases
	f[lockmodel.Tokens] = 3
	return f
}

// TestLockModelEtcdRevoke runs the lock model while the holder's etcd lease
// is revoked from another client again and again, and judges every check,
// the promise with the revoked Locker's beliefs excused within the
// detection bound only; then the control, a Locker that ignores a lost
// lease (its grants' Lost never closes), which the promise check must
// reject past the bound in most seeds.
//
// A revoke may end the lease under the key of an attempt whose reply never
// came (a waiter that gave up), and with it the other grants of that
// Locker on the lease: the actors' backends record which Locker tried
// each holder id (trackedBackend), so that the excuse names the Locker.
func TestLockModelEtcdRevoke(t *testing.T) {
	c := sharedCluster(t)
	e := newLockEtcd(t, c)
	e.tracked = func(*backend.Backend) {}
	cfg := lockmodel.Config{LateWait: etcdLateWait, RenewTTL: etcdRenewTTL, LongTTL: etcdLongTTL, LongEvery: revokeLongEvery,
		Budget: 2 * lockmodel.Budget(t), Floors: revokeFloors(), Faults: true, Label: "revoke",
		Resource: "lmodel:rv:" + e.prefix[7:19]}
	b := e.backend()
	b.Faults = []lockmodel.Fault{e.revokeHolder(func() string { return cfg.Resource })}
	r := lockmodel.Run(t, b, cfg)
	r.Report(t)
	r.Check(t, cfg.Floors)
	if r.Count("faults: holder's lease revoked") == 0 {
		t.Error("no lease was revoked during the run")
	}

	t.Run("control", func(t *testing.T) {
		ig := newLockEtcd(t, c)
		ig.tracked = func(b *backend.Backend) { b.IgnoreLoss = true }
		resource := "lmodel:rvc:" + ig.prefix[7:19]
		cs := []lockmodel.Control{{
			Name:     "a Locker that ignores a lost lease",
			CaughtBy: []string{lockmodel.Promise},
			Install: func(testing.TB) (lockmodel.Backend, func()) {
				b := ig.backend()
				b.Faults = []lockmodel.Fault{ig.revokeHolder(func() string { return resource })}
				return b, func() {}
			},
		}}
		lockmodel.RunControls(t, cs, lockmodel.Budget(t), lockmodel.Config{LateWait: etcdLateWait, RenewTTL: etcdRenewTTL,
			LongTTL: etcdLongTTL, LongEvery: revokeLongEvery, Faults: true, Resource: resource})
	})
}
