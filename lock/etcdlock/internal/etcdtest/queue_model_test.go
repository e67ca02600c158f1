package etcdtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

// The lock model's queue check on etcd. It needs three things the layout
// does not keep: which call each holder id belongs to (the actors'
// backends tell the model before each try, as the Redis and PostgreSQL
// backends do), how long a queued waiter's key stays without a refresh
// (its try's start plus the longer of its TTL and lockbackend.QueueLife,
// the entry's end, which only moves later while the waiter waits), and
// the log of grants, replayed from a watch of the run's keys: a grant is a
// key becoming the first of its resource's holder keys in create-revision
// order, which is what holds the lock on etcd.

// queueJudge is what a lockEtcd keeps to judge the queue.
type queueJudge struct {
	log   *grantLog
	lives sync.Map // holder id -> keyLife of its queued key
	// passOver makes the broken variant of the control: a release first
	// sends the first waiter's key to the back of the queue (deleted and
	// put again, on its lease), so that the lock goes to the next one.
	passOver bool
}

// judgeQueue makes e's model runs judge the queue from now on: every
// grant against every waiter observed live and queued before it.
func (e *lockEtcd) judgeQueue() *queueJudge {
	q := &queueJudge{log: startGrantLog(e, e.prefix)}
	e.queue = q
	return q
}

// queueBackend is an actor's backend that waits in a queue.
type queueBackend interface {
	lockbackend.Backend
	lockbackend.Queue
}

// queueJudged is an actor's backend in a run that judges the queue.
type queueJudged struct {
	queueBackend
	q    *queueJudge
	cli  *clientv3.Client
	dir  func(resource string) string
	seen func(holder string)

	mu    sync.Mutex
	holds map[lockbackend.Hold]string // the variant's: a grant's resource
}

func (b *queueJudged) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	b.seen(req.Holder)
	start := time.Now()
	o, err := b.queueBackend.Try(ctx, req)
	if err == nil && o.Granted {
		b.granted(o.Hold, req.Resource)
	}
	if err == nil && req.Queue {
		// The put landed: the entry's end is at least this.
		b.q.lives.Store(req.Holder, keyLife{until: start.Add(max(req.TTL, lockbackend.QueueLife)), known: time.Now()})
	}
	return o, err
}

// keyLife is what a queued waiter's try that put its key promises.
type keyLife struct {
	until time.Time // the key stands at least until then, unless the waiter leaves
	known time.Time // the try's reply came
}

func (b *queueJudged) Adopt(req *lockbackend.Request, g lockbackend.HandOver) lockbackend.Hold {
	h := b.queueBackend.Adopt(req, g)
	b.granted(h, req.Resource)
	return h
}

func (b *queueJudged) Release(ctx context.Context, h lockbackend.Hold) error {
	if b.q.passOver {
		b.mu.Lock()
		resource, ok := b.holds[h]
		delete(b.holds, h)
		b.mu.Unlock()
		if ok {
			b.passOverFirst(ctx, resource)
		}
	}
	return b.queueBackend.Release(ctx, h)
}

// granted notes the resource of the grant h, for the broken variant.
func (b *queueJudged) granted(h lockbackend.Hold, resource string) {
	if !b.q.passOver {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds == nil {
		b.holds = map[lockbackend.Hold]string{}
	}
	b.holds[h] = resource
}

// passOverFirst is the control's broken release: with two waiters queued
// or more, the first one's key is deleted and put again, on its lease, at
// the back of the queue, before the release hands the lock on.
func (b *queueJudged) passOverFirst(ctx context.Context, resource string) {
	get, err := b.cli.Get(ctx, b.dir(resource), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil || len(get.Kvs) < 3 {
		return
	}
	// Only while the key that holds the lock stands: the first waiter's
	// key is then not the holder's (a lease that ended meanwhile would
	// have handed it the lock).
	holder, kv := get.Kvs[0], get.Kvs[1]
	k := string(kv.Key)
	del, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision),
		clientv3.Compare(clientv3.CreateRevision(string(holder.Key)), "=", holder.CreateRevision)).
		Then(clientv3.OpDelete(k)).Commit()
	if err != nil || !del.Succeeded {
		return
	}
	_, _ = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(kv.Value), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))).Commit()
}

// life is how long from sent, when a read that found holder's queued key
// was sent, the key stands at least without a refresh: what the last try
// whose reply came before sent promised; 0 when not known (a later try's
// reply replaced it).
func (q *queueJudge) life(holder string, sent time.Time) time.Duration {
	if v, ok := q.lives.Load(holder); ok && v.(keyLife).known.Before(sent) {
		return v.(keyLife).until.Sub(sent)
	}
	return 0
}

// grantLog is the server's log of the grants of every resource under a
// prefix, replayed from a watch of its keys from before the first.
type grantLog struct {
	cli    *clientv3.Client
	prefix string
	ctx    context.Context // the watch's: its progress requests go on its stream

	mu      sync.Mutex
	dirs    map[string]*grantDir // by resource
	applied int64                // every event up to this revision is applied
	err     error
}

// grantDir is one resource's holder keys and grants.
type grantDir struct {
	keys     map[string]*mvccpb.KeyValue
	first    string // the key that holds the lock, "" when none
	firstRev int64
	grants   map[string]fence.Token // holder id -> its lowest token
}

func startGrantLog(e *lockEtcd, prefix string) *grantLog {
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	g := &grantLog{cli: e.watcher, prefix: prefix, ctx: ctx, dirs: map[string]*grantDir{}}
	get, err := e.watcher.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	if get.Count != 0 {
		e.t.Fatalf("the grant log of %q starts on %d keys", prefix, get.Count)
	}
	g.applied = get.Header.Revision
	wch := e.watcher.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(g.applied+1))
	go g.follow(wch)
	return g
}

// follow applies the watch's events, one revision at a time.
func (g *grantLog) follow(wch clientv3.WatchChan) {
	for resp := range wch {
		g.mu.Lock()
		if err := resp.Err(); err != nil {
			g.err = err
			g.mu.Unlock()
			return
		}
		changed := map[*grantDir]bool{}
		for i, ev := range resp.Events {
			if d := g.dir(string(ev.Kv.Key)); d != nil {
				if ev.Type == clientv3.EventTypeDelete {
					delete(d.keys, string(ev.Kv.Key))
				} else {
					d.keys[string(ev.Kv.Key)] = ev.Kv
				}
				changed[d] = true
			}
			if i == len(resp.Events)-1 || resp.Events[i+1].Kv.ModRevision != ev.Kv.ModRevision {
				for d := range changed {
					d.settle()
				}
				clear(changed)
				g.applied = max(g.applied, ev.Kv.ModRevision)
			}
		}
		if resp.IsProgressNotify() {
			g.applied = max(g.applied, resp.Header.Revision)
		}
		g.mu.Unlock()
	}
}

// dir returns the state of the resource whose holder key is key, or nil
// for a key of another kind. grantLog.mu is held.
func (g *grantLog) dir(key string) *grantDir {
	rest, ok := strings.CutPrefix(key, g.prefix+"{")
	if !ok {
		return nil
	}
	resource, _, ok := strings.Cut(rest, "}/h/")
	if !ok {
		return nil
	}
	d := g.dirs[resource]
	if d == nil {
		d = &grantDir{keys: map[string]*mvccpb.KeyValue{}, grants: map[string]fence.Token{}}
		g.dirs[resource] = d
	}
	return d
}

// settle records a grant when the first key changed.
func (d *grantDir) settle() {
	var first *mvccpb.KeyValue
	for _, kv := range d.keys {
		if first == nil || kv.CreateRevision < first.CreateRevision {
			first = kv
		}
	}
	if first == nil {
		d.first, d.firstRev = "", 0
		return
	}
	if string(first.Key) == d.first && first.CreateRevision == d.firstRev {
		return
	}
	d.first, d.firstRev = string(first.Key), first.CreateRevision
	tok := etcdlock.TokenBase + fence.Token(first.CreateRevision)
	if t, ok := d.grants[string(first.Value)]; !ok || tok < t {
		d.grants[string(first.Value)] = tok
	}
}

// Grants returns resource's grants up to now: it waits until the watch
// has applied every event up to a read made now.
func (g *grantLog) Grants(ctx context.Context, resource string) (map[string]fence.Token, error) {
	get, err := g.cli.Get(ctx, g.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	for {
		g.mu.Lock()
		applied, werr := g.applied, g.err
		var out map[string]fence.Token
		if applied >= get.Header.Revision {
			out = map[string]fence.Token{}
			if d := g.dirs[resource]; d != nil {
				for h, t := range d.grants {
					out[h] = t
				}
			}
		}
		g.mu.Unlock()
		switch {
		case werr != nil:
			return nil, fmt.Errorf("the watch of the grants: %w", werr)
		case out != nil:
			return out, nil
		}
		// A watch that has sent every event tells its revision when asked.
		_ = g.cli.RequestProgress(g.ctx)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the watch of the grants applied revision %d, not yet %d: %w", applied, get.Header.Revision, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
