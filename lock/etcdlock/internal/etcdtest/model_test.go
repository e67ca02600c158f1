package etcdtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// The lock model (internal/harness/lockmodel) on etcd: a run on a
// three-member cluster under faults (the leader stopped and started
// again, a member cut off from its clients by its proxy) and negative
// controls (leases believed on the client's clock, one slot for every
// acquisition, a release that passes over the first waiter).

// lockEtcd is the model's etcd backend: the actors connect through the
// members' proxies, the watcher to the members directly.
type lockEtcd struct {
	t       *testing.T
	c       *Cluster
	watcher *clientv3.Client
	prefix  string
	// open makes an actor's Locker's backend; etcdlock's when nil.
	open func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error)
	// tracked, when set (in place of open), tunes each actor's backend,
	// which then records in actors the actor of each holder id it tries.
	tracked func(*backend.Backend)
	actors  sync.Map // holder id -> actor
	// queue, when set (judgeQueue), wraps every actor's backend so that
	// the model judges the queue.
	queue *queueJudge
}

func newLockEtcd(t *testing.T, c *Cluster) *lockEtcd {
	var direct []string
	for _, m := range c.Members {
		direct = append(direct, m.DirectURL())
	}
	return &lockEtcd{t: t, c: c, watcher: c.ClientOf(t, direct...), prefix: "lmodel/" + fence.NewHolder()[:12] + "/"}
}

func (e *lockEtcd) backend() lockmodel.Backend {
	b := lockmodel.Backend{Name: "etcd", Locker: e.locker, Observe: e.observe}
	if e.queue != nil {
		b.Grants = e.queue.log.Grants
	}
	return b
}

func (e *lockEtcd) locker(actor int, seen func(string)) (*lock.Locker, error) {
	cli := e.c.Client(e.t)
	open := e.open
	if open == nil && e.queue != nil {
		open = func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
			return backend.New(cli, s)
		}
	}
	if q := e.queue; q != nil {
		inner := open
		open = func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
			b, err := inner(cli, s)
			if err != nil {
				return nil, err
			}
			return &queueJudged{queueBackend: b.(queueBackend), q: q, cli: cli, seen: seen,
				dir: func(resource string) string { return e.prefix + "{" + resource + "}/h/" }}, nil
		}
	}
	if e.tracked != nil {
		open = func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
			b, err := backend.New(cli, s)
			if err != nil {
				return nil, err
			}
			e.tracked(b)
			return trackedBackend{b, e, actor}, nil
		}
	}
	if open == nil {
		return etcdlock.New(cli, lock.WithPrefix(e.prefix))
	}
	l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
		return open(cli, s)
	}, []any{lock.WithPrefix(e.prefix)})
	if err != nil {
		return nil, err
	}
	return l.(*lock.Locker), nil
}

// observe reads the resource's holder keys in one range read, in
// create-revision order, as the backend's layout documents them: under
// "<prefix>{<resource>}/h/", one per holder and queued waiter, named by a
// slot of the Locker that put it, its value the holder id; the first holds
// the lock, and its token is TokenBase plus its create revision. The
// holder is read from the value, never the name, so that a slot's key
// taken for another acquisition's is seen as the other holder's. The floor
// is TokenBase plus the read's revision, below every key created after
// it, or the clock in µs if that is higher (the token space the backends
// share). How long a waiter's key stands without a refresh is not in the
// read: in a run that judges the queue (judgeQueue) it is what the
// waiter's last try that put the key promises (queueJudge.lives);
// otherwise the waiters are listed as lapsed, and the queue is not judged.
func (e *lockEtcd) observe(ctx context.Context, resource string) (lockmodel.Observation, error) {
	var o lockmodel.Observation
	dir := e.prefix + "{" + resource + "}/h/"
	sent := time.Now()
	resp, err := e.watcher.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return o, err
	}
	// Every token is also above the clock in µs, which the other
	// backends' tokens follow: a resource moved from them to etcd stays
	// fenced (the token space the backends share).
	o.Floor = max(etcdlock.TokenBase+fence.Token(resp.Header.Revision), fence.Token(time.Now().UnixMicro()))
	for i, kv := range resp.Kvs {
		holder := string(kv.Value)
		if slot, ok := strings.CutPrefix(string(kv.Key), dir); !ok || slot == "" || holder == "" {
			return o, fmt.Errorf("observe: key %q (value %q) is not a holder's", kv.Key, kv.Value)
		}
		if i == 0 {
			o.Holder, o.Token = holder, etcdlock.TokenBase+fence.Token(kv.CreateRevision)
			continue
		}
		var life time.Duration
		if e.queue != nil {
			life = e.queue.life(holder, sent)
		}
		o.Waiters = append(o.Waiters, lockmodel.Waiter{Holder: holder, Life: life})
	}
	return o, nil
}

// etcdLateWait is short: a late release waits for no other holder, since
// the server keeps the lease for whole seconds, well past the holder's
// own belief.
const etcdLateWait = 20 * time.Millisecond

// etcdRenewTTL is the TTL of renewed leases on etcd, whose renewals are
// keep-alives answered by the leader: long enough for them to land on a
// loaded machine.
const etcdRenewTTL = time.Second

// etcdFloors are the model's floors on etcd, whose leases last whole
// seconds on the server (fewer grants per run), and which keeps no log of
// grants (the queue is judged only by a run that replays one: see
// judgeQueue) and never leaves the lock free with a waiter queued (the
// first key holds it).
func etcdFloors() map[string]int {
	f := lockmodel.DefaultFloors()
	for _, k := range []string{lockmodel.Queue, lockmodel.WaiterAhead, lockmodel.FreeWithWaiter, lockmodel.LateReleaseMet} {
		delete(f, k)
	}
	f[lockmodel.Promise] = 10
	f[lockmodel.Tokens] = 3
	f[lockmodel.Anchor] = 2
	f[lockmodel.Renewal] = 0
	return f
}

// lateReleases makes about one in every of the releases of the backends
// that open makes lose its reply, and sends each such deletion late, at
// the worst time a network that holds a request back could choose: as a
// later grant of the key (the slot taken by a later acquisition of the
// Locker, which the backend must never do) is reported to its Locker,
// before the Locker believes it, or after lateHold if none is. landed
// counts the deletions sent late; the test waits for them before its
// cluster stops.
func lateReleases(t *testing.T, c *Cluster, every int, landed, atGrant *atomic.Int64) func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
	// The late deletions' own client, closed after they have all landed.
	lc := c.Client(t)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	return func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
		b, err := backend.New(cli, s)
		if err != nil {
			return nil, err
		}
		lb := &lateBackend{Backend: b, lc: lc, landed: landed, atGrant: atGrant, pending: map[string]*lateDelete{}, slow: map[lockbackend.Hold]bool{}}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		b.SendDelete = func(ctx context.Context, key string) (*clientv3.DeleteResponse, error) {
			lb.mu.Lock()
			late := rng.IntN(every) == 0
			lb.mu.Unlock()
			if !late {
				return cli.Delete(ctx, key)
			}
			// The grant's own put: a later one is created above it.
			get, err := lc.Get(ctx, key)
			if err != nil || len(get.Kvs) == 0 {
				return cli.Delete(ctx, key)
			}
			d := &lateDelete{rev: get.Kvs[0].CreateRevision}
			lb.mu.Lock()
			lb.pending[key] = d
			lb.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				timeout := time.NewTimer(lateHold)
				defer timeout.Stop()
				select {
				case <-stop:
				case <-timeout.C:
				}
				lb.land(key, d)
			}()
			return nil, errLostOnPurpose
		}
		return lb, nil
	}
}

// lateHold is how long lateReleases holds a deletion back when no later
// grant of its key is reported.
const lateHold = 10 * time.Second

// lateBackend is an actor's backend whose releases' deletions lateReleases
// holds back: it lands a held deletion of a key as a later grant of that
// key is reported, before the grant's Locker believes it.
type lateBackend struct {
	*backend.Backend
	lc     *clientv3.Client
	landed *atomic.Int64
	// atGrant counts the deletions landed as a later grant of their key
	// was reported: none unless the backend reused the slot.
	atGrant *atomic.Int64

	mu      sync.Mutex
	pending map[string]*lateDelete    // by key
	slow    map[lockbackend.Hold]bool // grants whose key a late deletion took
}

// lateDelete is a release's deletion held back.
type lateDelete struct {
	rev  int64 // the released grant's put of the key
	done bool
}

// land sends d, the deletion of key held back, once.
func (b *lateBackend) land(key string, d *lateDelete) {
	b.mu.Lock()
	if d.done {
		b.mu.Unlock()
		return
	}
	d.done = true
	if b.pending[key] == d {
		delete(b.pending, key)
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.lc.Delete(ctx, key); err == nil {
		b.landed.Add(1)
	}
}

// granted lands the deletion held back of the key that holds resource's
// lock for holder with token tok, if a later put of it made that grant,
// and then holds back the grant's Extend and TTL calls a while
// (lateSlow): they would find the key gone, and end the belief, before the
// model sees another holder hold the lock.
func (b *lateBackend) granted(h lockbackend.Hold, resource, holder string, tok fence.Token) {
	dir := b.Prefix() + "{" + resource + "}/h/"
	b.mu.Lock()
	var keys []string
	for k := range b.pending {
		if strings.HasPrefix(k, dir) {
			keys = append(keys, k)
		}
	}
	b.mu.Unlock()
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		get, err := b.lc.Get(ctx, k)
		cancel()
		if err != nil || len(get.Kvs) == 0 {
			continue
		}
		kv := get.Kvs[0]
		b.mu.Lock()
		d := b.pending[k]
		b.mu.Unlock()
		if d != nil && string(kv.Value) == holder && kv.CreateRevision > d.rev && etcdlock.TokenBase+fence.Token(kv.CreateRevision) == tok {
			b.atGrant.Add(1)
			b.land(k, d)
			b.mu.Lock()
			b.slow[h] = true
			b.mu.Unlock()
		}
	}
}

// lateSlow is how long a grant's Extend and TTL calls are held back once
// a late deletion landed on its key.
const lateSlow = 50 * time.Millisecond

// heldBack holds a call of the grant h back for lateSlow if a late
// deletion landed on its key.
func (b *lateBackend) heldBack(ctx context.Context, h lockbackend.Hold) {
	b.mu.Lock()
	slow := b.slow[h]
	b.mu.Unlock()
	if slow {
		select {
		case <-time.After(lateSlow):
		case <-ctx.Done():
		}
	}
}

func (b *lateBackend) Extend(ctx context.Context, h lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	b.heldBack(ctx, h)
	return b.Backend.Extend(ctx, h, ttl)
}

func (b *lateBackend) TTL(ctx context.Context, h lockbackend.Hold) (time.Duration, error) {
	b.heldBack(ctx, h)
	return b.Backend.TTL(ctx, h)
}

func (b *lateBackend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	o, err := b.Backend.Try(ctx, req)
	if err == nil && o.Granted {
		b.granted(o.Hold, req.Resource, req.Holder, o.Token)
	}
	return o, err
}

func (b *lateBackend) Adopt(req *lockbackend.Request, g lockbackend.HandOver) lockbackend.Hold {
	h := b.Backend.Adopt(req, g)
	b.granted(h, req.Resource, req.Holder, g.Token)
	return h
}

// TestLockModelEtcd runs the lock model on a three-member cluster, once
// undisturbed but for releases whose replies are lost and whose deletions
// land late, judging the queue too (judgeQueue), then while the leader is
// stopped and started again and members are cut off from their clients,
// and judges every check with its floor.
func TestLockModelEtcd(t *testing.T) {
	c := StartCluster(t, 3)
	e := newLockEtcd(t, c)
	var landed, atGrant atomic.Int64
	t.Cleanup(func() { // after lateReleases' own, which waits for them
		t.Logf("releases whose replies were lost and whose deletions landed late: %d (as a later grant of their key was reported: %d)", landed.Load(), atGrant.Load())
		if landed.Load() == 0 {
			t.Error("no release's deletion landed late")
		}
	})
	e.open = lateReleases(t, c, 2, &landed, &atGrant)
	e.judgeQueue()
	// Twice the model's budget: three members serve in this process, and
	// each grant is a lease's grant and a transaction, each a consensus
	// round; a leader's restart stalls the calls in flight to it.
	cfg := lockmodel.Config{LateWait: etcdLateWait, RenewTTL: etcdRenewTTL, Budget: 2 * lockmodel.Budget(t), Floors: etcdFloors()}
	undisturbed := cfg
	undisturbed.Floors = etcdFloors()
	undisturbed.Floors[lockmodel.Queue] = 3
	undisturbed.Floors[lockmodel.WaiterAhead] = 1
	r := lockmodel.Run(t, e.backend(), undisturbed)
	r.Report(t)
	r.Check(t, undisturbed.Floors)

	// The queue is judged undisturbed only: a waiter's key stands on a
	// lease its process keeps alive, which a member cut off or a leader
	// stopped may let end with the key before its entry's end.
	e.queue = nil
	b := e.backend()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	b.Faults = []lockmodel.Fault{
		{Name: "leader restarted", Limit: 1, Inject: func(ctx context.Context) error {
			i := c.Leader(t)
			c.Stop(i)
			time.Sleep(300 * time.Millisecond)
			c.Restart(t, i)
			return nil
		}},
		// Quorum stands: renewals and reads sent to the follower give up
		// on it within a part of the TTL and go to another member, so the
		// renewed leases are kept (the model's renewal check).
		{Name: "follower cut off from its peers", Limit: 1, Inject: func(ctx context.Context) error {
			m := c.Members[(c.Leader(t)+1)%len(c.Members)]
			c.Peers.Isolate(m)
			defer c.Peers.Heal()
			select {
			case <-ctx.Done():
			case <-time.After(1500 * time.Millisecond):
			}
			return nil
		}},
		{Name: "member cut off", Limit: 2, Inject: func(ctx context.Context) error {
			m := c.Members[rng.IntN(len(c.Members))]
			m.Proxy.Block()
			time.Sleep(300 * time.Millisecond)
			m.Proxy.Unblock()
			return nil
		}},
	}
	cfg.Faults, cfg.Label = true, "faults"
	r = lockmodel.Run(t, b, cfg)
	r.Report(t)
	r.Check(t, cfg.Floors)
	if r.Count("faults: leader restarted") == 0 {
		t.Error("the leader was not restarted during the run")
	}
	// The report above counts each fault injected; a run too short (a
	// loaded machine) to cut a follower off judged that fault nothing.
	if r.Count("faults: follower cut off from its peers") == 0 {
		t.Log("no follower was cut off from its peers during the run")
	}
}

// clientClockBackend is a broken etcd backend: a holder believes its lease
// 10s longer than the server keeps it (etcd's leases last whole
// seconds, at least two), as if it counted the lease's end on
// its own clock, skewed, rather than the server's lease.
type clientClockBackend struct{ *backend.Backend }

const clientSkew = 10 * time.Second

func (b clientClockBackend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	o, err := b.Backend.Try(ctx, req)
	if err == nil && o.Granted {
		o.Known += clientSkew
	}
	return o, err
}

func (b clientClockBackend) Extend(ctx context.Context, h lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	d, err := b.Backend.Extend(ctx, h, ttl)
	if err == nil {
		d += clientSkew
	}
	return d, err
}

// TestLockModelEtcdControl runs the model on the broken backends with
// three seeds each, each run until it goes wrong (for at most eight times
// the model's budget): the promise check (or, for a confused slot, the
// token checks; for a waiter that loses its place, the queue check) must
// reject each in most of them. The broken variant that reuses the slot of
// a lost release is judged by its own deterministic control
// (TestLateReleaseControlReusedSlot), and by TestLockModelEtcd's late
// releases, which land as such a slot's next grant is reported.
func TestLockModelEtcdControl(t *testing.T) {
	c := StartCluster(t, 3)
	e := newLockEtcd(t, c)
	e.open = func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
		b, err := backend.New(cli, s)
		if err != nil {
			return nil, err
		}
		// A belief on the client's clock hears nothing of the server:
		// without this its keep-alive's loss signal would end the lease
		// when the key goes, and the variant would be half healed.
		b.IgnoreLoss = true
		return clientClockBackend{b}, nil
	}
	// A Locker whose acquisitions of a resource all take one slot: a
	// queued try then puts its holder id over the key of a grant of the
	// same Locker that still stands (one left to run out), and is granted
	// on it. The model reads the holder from a key's value, so it sees the
	// lock held by another holder while the first still believes in it.
	one := newLockEtcd(t, c)
	one.open = func(cli *clientv3.Client, s lockbackend.Settings) (lockbackend.Backend, error) {
		b, err := backend.New(cli, s)
		if err != nil {
			return nil, err
		}
		b.OneSlot = true
		return b, nil
	}
	// A Locker whose release first sends the first waiter's key to the
	// back of the queue: the next waiter, which came after it, is served
	// first.
	rq := newLockEtcd(t, c)
	rq.judgeQueue().passOver = true
	cs := []lockmodel.Control{{
		Name:     "lease on the client's clock",
		CaughtBy: []string{lockmodel.Promise},
		Install:  func(testing.TB) (lockmodel.Backend, func()) { return e.backend(), func() {} },
	}, {
		Name:     "one slot for every acquisition",
		CaughtBy: []string{lockmodel.Promise, lockmodel.Tokens, lockmodel.Anchor},
		Install:  func(testing.TB) (lockmodel.Backend, func()) { return one.backend(), func() {} },
	}, {
		Name:     "a release that passes over the first waiter",
		CaughtBy: []string{lockmodel.Queue},
		Install:  func(testing.TB) (lockmodel.Backend, func()) { return rq.backend(), func() {} },
	}}
	// The server keeps a lease two seconds at least, and a grant takes
	// consensus rounds: a run must last past a lease's end on the server
	// to see it, and may take a while to make a grant.
	lockmodel.RunControls(t, cs, 2*lockmodel.Budget(t), lockmodel.Config{LateWait: etcdLateWait, RenewTTL: etcdRenewTTL})
}
