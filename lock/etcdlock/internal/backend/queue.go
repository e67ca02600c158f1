package backend

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// room is one resource's waiters in this process and the watch that tells
// them of hand-overs: the watch covers the resource's holder keys, and
// every deletion among them (a release, an expiry, a waiter that left)
// makes the room read the first key once. A waiter of this process whose
// key is first was handed the lock; a directory left empty wakes one
// waiter. Nothing polls: a waiter hears only of deletions.
type room struct {
	b        *Backend
	resource string
	cancel   context.CancelFunc

	mu      sync.Mutex
	waiters map[*waiter]struct{}
	ready   chan struct{}
	lost    chan struct{}
	up      bool
}

// waiter is one waiting acquisition.
type waiter struct {
	r       *room
	holder  string
	wake    chan struct{}
	granted chan lockbackend.HandOver
	placed  chan lockbackend.Place
	mu      sync.Mutex
	owe     bool
}

// Join registers holder's waiter for resource's hand-overs; with create
// false, only where this process already watches the resource.
func (b *Backend) Join(resource, holder string, create bool) lockbackend.Waiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	r := b.rooms[resource]
	if r == nil {
		if !create {
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		r = &room{b: b, resource: resource, cancel: cancel, waiters: map[*waiter]struct{}{},
			ready: make(chan struct{}), lost: make(chan struct{})}
		b.rooms[resource] = r
		b.wg.Add(1)
		go r.watch(ctx)
	}
	w := &waiter{r: r, holder: holder, wake: make(chan struct{}, 1),
		granted: make(chan lockbackend.HandOver, 1), placed: make(chan lockbackend.Place, 1)}
	r.mu.Lock()
	r.waiters[w] = struct{}{}
	r.mu.Unlock()
	return w
}

// Adopt makes the Hold of a grant announced to a waiter: the entry its
// refresh put, whose key then ends the TTL after that refresh's try began,
// which is no sooner than the lease the Locker counts from the HandOver.
func (b *Backend) Adopt(req *lockbackend.Request, g lockbackend.HandOver) lockbackend.Hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[holderRef{req.Resource, req.Holder}]
	if e == nil || e.gone {
		// Its end passed and the key was deleted: a grant already over.
		return &entry{b: b, resource: req.Resource, holder: req.Holder, ttl: req.TTL, gone: true}
	}
	e.rev = int64(g.Token - TokenBase)
	e.endAt(e.sent.Add(req.TTL), false)
	return e
}

// watch keeps the room's watch up until the room is cancelled: a watch
// that fails (its member lost the leader, the connection broke) is said
// lost, and a new one starts, read again from scratch.
func (r *room) watch(ctx context.Context) {
	defer r.b.wg.Done()
	prefix := r.b.holders(r.resource)
	var bo backoff
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wc := r.b.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		for resp := range wc {
			if resp.Err() != nil || resp.Canceled {
				break
			}
			if resp.Created {
				bo.reset()
				r.setUp()
				r.check(ctx) // what was deleted before the watch began
				continue
			}
			deleted := false
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					deleted = true
				}
			}
			if deleted {
				r.check(ctx)
			}
		}
		cancel()
		r.setLost()
		// A member with no leader refuses the watch at once: wait
		// before the next, longer each time in a row.
		if !bo.wait(ctx) {
			return
		}
	}
}

func (r *room) setUp() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.up {
		r.up = true
		close(r.ready)
	}
}

func (r *room) setLost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.up {
		r.up = false
		close(r.lost)
		r.ready, r.lost = make(chan struct{}), make(chan struct{})
	}
}

// check reads the first key and tells the waiter whose key it is (by the
// key's value, the holder id, and its slot) of its grant, or wakes one
// waiter when no key is left.
func (r *room) check(ctx context.Context) {
	resp, err := r.b.cli.Get(ctx, r.b.holders(r.resource), clientv3.WithFirstCreate()...)
	if err != nil {
		return // the next deletion, or the waiters' own refresh, tries again
	}
	r.mu.Lock()
	ws := make([]*waiter, 0, len(r.waiters))
	for w := range r.waiters {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	if len(resp.Kvs) == 0 {
		ws[0].poke()
		return
	}
	kv := resp.Kvs[0]
	tok, err := token(kv.CreateRevision)
	if err != nil {
		return
	}
	if kv.CreateRevision <= r.b.wentBack.Load() {
		// A key of the cluster as it was before it went back: its
		// waiter's try says so.
		for _, w := range ws {
			if string(kv.Value) == w.holder {
				w.poke()
			}
		}
		return
	}
	for _, w := range ws {
		if string(kv.Value) != w.holder {
			continue
		}
		age, ok := r.b.handOverAge(r.resource, w.holder, kv)
		if !ok {
			// Not the entry this process put last, or a lease mostly
			// over: the waiter tries, and its try grants it.
			w.poke()
			return
		}
		select {
		case <-w.granted:
		default:
		}
		w.granted <- lockbackend.HandOver{Token: tok, Ref: kv.ModRevision, Age: age}
		return
	}
}

func (w *waiter) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *waiter) State() (ready, lost <-chan struct{}, confirmed bool) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.ready, w.r.lost, w.r.up
}

func (w *waiter) Wake() <-chan struct{}                { return w.wake }
func (w *waiter) Granted() <-chan lockbackend.HandOver { return w.granted }
func (w *waiter) Placed() <-chan lockbackend.Place     { return w.placed }
func (w *waiter) Owe(b bool)                           { w.mu.Lock(); w.owe = b; w.mu.Unlock() }

// Leave removes the waiter, handing a wake-up it owes to another; the last
// waiter of a resource stops the room's watch.
func (w *waiter) Leave(acquired bool) {
	r := w.r
	w.mu.Lock()
	owe := w.owe
	w.mu.Unlock()
	r.b.mu.Lock()
	r.mu.Lock()
	delete(r.waiters, w)
	empty := len(r.waiters) == 0
	if !acquired && owe {
		for o := range r.waiters {
			o.poke()
			break
		}
	}
	r.mu.Unlock()
	if empty && r.b.rooms[r.resource] == r {
		delete(r.b.rooms, r.resource)
		r.cancel()
	}
	r.b.mu.Unlock()
}

// handOverAge is the Age of a hand-over to the entry of resource and
// holder, whose key was found first as kv: the Locker counts the grant's lease from the refreshing try's
// send plus Age, for the TTL, and that must end no later than what the
// server holds the key for, less the drift allowance: the entry's end and
// what its session's last acknowledged keep-alive guarantees. So Age is 0
// or less. ok is false when kv is not the entry as this process last put
// it, and when the lease so counted has less than a quarter of its TTL
// left (a waiter refreshes once a second, so a hand-over to a waiter with
// a shorter TTL would often come already over): the waiter's own try then
// grants it a lease counted from that try.
func (b *Backend) handOverAge(resource, holder string, kv *mvccpb.KeyValue) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[holderRef{resource, holder}]
	if e == nil || e.gone || e.ending || e.s == nil || e.key != string(kv.Key) || e.mod != kv.ModRevision || int64(e.s.id) != kv.Lease {
		// Not the entry as last put, or its deletion at its end is decided.
		return 0, false
	}
	held := e.end
	if g := e.s.ackSent.Add(e.s.ackTTL); g.Before(held) {
		held = g
	}
	age := min(0, held.Add(-drift(e.ttl)).Sub(e.sent.Add(e.ttl)))
	if time.Until(e.sent.Add(age+e.ttl)) < e.ttl/4 {
		return 0, false
	}
	return age, true
}
