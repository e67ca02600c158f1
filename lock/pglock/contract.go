package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The backend implements the lock's contract: grants, a queue woken by
// the release, the record beside the lock and a token counter.
var (
	_ lockbackend.Backend  = (*pgBackend)(nil)
	_ lockbackend.Queue    = (*pgBackend)(nil)
	_ lockbackend.Recorder = (*pgBackend)(nil)
	_ lockbackend.Advancer = (*pgBackend)(nil)
)

// pgBackend is the backend as package lock sees it.
type pgBackend struct {
	*backend
	background func(ctx context.Context, f func(ctx context.Context))

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // by resource
	closed  bool
}

// hold is a grant's record: what Extend, Release and TTL send.
type hold struct {
	resource, holder string
}

// open makes the backend from a Locker's settings, refusing those that
// mean nothing on PostgreSQL.
func open(b *backend, s lockbackend.Settings) (*pgBackend, error) {
	switch {
	case s.Given&lockbackend.GivenPrefix != 0:
		return nil, fmt.Errorf("%w: pglock: New: lock.WithPrefix names Redis keys; a PostgreSQL lock keeps its rows in the fencekit_lock table", lockbackend.ErrUnsupported)
	case s.Given&lockbackend.GivenNodeTimeout != 0:
		return nil, fmt.Errorf("%w: pglock: New: a node timeout is Redlock's; a PostgreSQL lock has one server, bounded by each call's context", lockbackend.ErrUnsupported)
	}
	p := &pgBackend{backend: b, background: s.Background, waiters: make(map[string]map[*waiter]struct{})}
	return p, nil
}

// Info says what the backend offers: a queue unless it polls, no owners'
// re-entrant holds.
func (p *pgBackend) Info() lockbackend.Info {
	return lockbackend.Info{Name: "postgres", Quorum: 1, Queue: p.listen != nil}
}

// inBackground runs f after its caller's ctx, bounded.
func (p *pgBackend) inBackground(ctx context.Context, f func(ctx context.Context)) {
	if p.background != nil {
		p.background(ctx, f)
		return
	}
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		defer cancel()
		f(bctx)
	}()
}

// Try makes one attempt, in one round trip (see fencekit_lock_acquire).
func (p *pgBackend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	if req.Owner != "" {
		return lockbackend.Outcome{}, fmt.Errorf("pglock: Acquire %q with an owner: %w", req.Resource, lockbackend.ErrUnsupported)
	}
	var life time.Duration
	if req.Queue {
		life = p.life
	}
	op := "Acquire"
	if req.Once {
		op = "TryAcquire"
	}
	g, r, err := p.try(ctx, op, req.Resource, req.Holder, req.TTL, life, req.Ordered)
	if err != nil {
		if ctx.Err() != nil || mayHaveRun(err) {
			// The grant may have been made: undo it, and the queue entry.
			resource, holder := req.Resource, req.Holder
			p.inBackground(ctx, func(ctx context.Context) {
				_, _ = p.releaseAs(ctx, "Acquire", resource, holder, true)
			})
			// And once the grant's deadline has passed, void what it
			// may still grant (see late.go).
			p.giveUp(resource, holder)
			if ctx.Err() == nil {
				err = fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, err)
			}
		}
		return lockbackend.Outcome{}, err
	}
	if r != nil {
		if req.Once {
			// TryAcquire is done with this holder: a request of this
			// try's that a retry answered in its place may still grant
			// (see lockbackend.LateRequests). Acquire's later tries keep the holder, and
			// its end (Release, Abandon) gives it up.
			p.giveUp(req.Resource, req.Holder)
		}
		return lockbackend.Outcome{Remaining: r.remaining, Place: int64(r.place), Ref: r.ref}, nil
	}
	known := req.TTL
	if g.retried {
		// Counted from the server's statement, after the try was sent:
		// no more than the server holds.
		known = min(g.remaining, req.TTL)
	}
	return lockbackend.Outcome{
		Granted:     true,
		Hold:        hold{req.Resource, req.Holder},
		Token:       g.token,
		Holder:      req.Holder,
		Known:       known,
		HandedOver:  g.retried && req.Queue,
		StateMissed: g.fromClock,
	}, nil
}

// unknown marks an error of a call whose request may have run.
func unknown(ctx context.Context, err error) error {
	if ctx.Err() == nil && mayHaveRun(err) && !errors.Is(err, lockbackend.ErrReplyLost) {
		return fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, err)
	}
	return err
}

// Extend lengthens the lease, never shortening it; the answer, counted on
// the server after the call was sent, is no more than the server holds.
func (p *pgBackend) Extend(ctx context.Context, h lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	hd := h.(hold)
	d, err := p.extend(ctx, hd.resource, hd.holder, ttl)
	if err != nil {
		return 0, unknown(ctx, err)
	}
	return d, nil
}

// Release frees the lock, handing it to the first live waiter.
func (p *pgBackend) Release(ctx context.Context, h lockbackend.Hold) error {
	hd := h.(hold)
	held, err := p.release(ctx, hd.resource, hd.holder)
	// A request of this grant's that a retry answered in its place may
	// still reach the server: void it once its deadline has passed.
	p.giveUp(hd.resource, hd.holder)
	if err != nil {
		return unknown(ctx, err)
	}
	if !held {
		return fmt.Errorf("pglock: Release %q: %w", hd.resource, lockbackend.ErrNotHeld)
	}
	return nil
}

// TTL reads what is left of the lease on the server.
func (p *pgBackend) TTL(ctx context.Context, h lockbackend.Hold) (time.Duration, error) {
	hd := h.(hold)
	return p.ttl(ctx, hd.resource, hd.holder)
}

// Abandon releases what an attempt of holder may have left (a grant, one
// handed over, its queue entry), in one round trip.
func (p *pgBackend) Abandon(ctx context.Context, resource, holder, acq string) error {
	if acq != "" {
		return fmt.Errorf("pglock: Abandon %q with an owner's hold: %w", resource, lockbackend.ErrUnsupported)
	}
	_, err := p.releaseAs(ctx, "Acquire", resource, holder, true)
	p.giveUp(resource, holder)
	return err
}

// Close stops the listener and the reclaimer, and waits for background
// releases until deadline at most.
func (p *pgBackend) Close(deadline time.Time) {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
	}
}

// Advance raises resource's token counter to at least atLeast.
func (p *pgBackend) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	return p.advance(ctx, resource, atLeast)
}

// Join registers a waiter for resource's hand-overs.
func (p *pgBackend) Join(resource, holder string, create bool) lockbackend.Waiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.listen == nil {
		return nil
	}
	m := p.waiters[resource]
	if m == nil {
		if !create {
			return nil
		}
		m = make(map[*waiter]struct{})
		p.waiters[resource] = m
	}
	w := &waiter{
		p: p, resource: resource, me: mark(holder),
		sub:     p.listen.subscribe(mark(resource)),
		wake:    make(chan struct{}, 1),
		granted: make(chan lockbackend.HandOver, 1),
		placed:  make(chan lockbackend.Place, 1),
		stop:    make(chan struct{}),
	}
	m[w] = struct{}{}
	go w.run()
	return w
}

// Adopt makes the Hold of a grant a release handed to req.Holder.
func (p *pgBackend) Adopt(req *lockbackend.Request, _ lockbackend.HandOver) lockbackend.Hold {
	return hold{req.Resource, req.Holder}
}

// wakeOne passes a wake-up to one waiter of resource other than except.
func (p *pgBackend) wakeOne(resource string, except *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for w := range p.waiters[resource] {
		if w == except {
			continue
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
		return
	}
}

// waiter is one waiting acquisition's view of its resource's
// notifications.
type waiter struct {
	p        *pgBackend
	resource string
	me       string // the holder's mark
	sub      *subscription
	wake     chan struct{}
	granted  chan lockbackend.HandOver
	placed   chan lockbackend.Place
	owe      atomic.Bool
	stop     chan struct{}
	left     sync.Once
}

func (w *waiter) run() {
	for {
		select {
		case <-w.stop:
			return
		case payload := <-w.sub.c:
			if payload == "" {
				continue // coverage changed: State says so
			}
			n, ok := parseNote(payload)
			if !ok {
				continue
			}
			switch {
			case n.granted == w.me:
				put(w.granted, lockbackend.HandOver{Token: fence.Token(n.token), Ref: n.ref, Age: n.age})
			case n.free():
				w.p.wakeOne(w.resource, nil)
			}
			if i := n.placeOf(w.me); i >= 0 {
				rem := n.remaining
				if rem == freeLock*time.Millisecond {
					rem = lockbackend.Free
				}
				put(w.placed, lockbackend.Place{Place: i, Remaining: rem, At: time.Now()})
			}
		}
	}
}

// put sends v on c (capacity 1), replacing an unread older value.
func put[T any](c chan T, v T) {
	for {
		select {
		case c <- v:
			return
		default:
		}
		select {
		case <-c:
		default:
		}
	}
}

// State: hand-overs are covered while the LISTEN connection is up; the
// subscription is in place from Join on.
func (w *waiter) State() (ready, lost <-chan struct{}, confirmed bool) {
	up, upC, downC := w.p.listen.state()
	if up {
		return closedChan, downC, true
	}
	return upC, nil, false
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (w *waiter) Wake() <-chan struct{}                { return w.wake }
func (w *waiter) Granted() <-chan lockbackend.HandOver { return w.granted }
func (w *waiter) Placed() <-chan lockbackend.Place     { return w.placed }
func (w *waiter) Owe(b bool)                           { w.owe.Store(b) }

// Leave removes the waiter; one that leaves without the lock passes a
// wake-up it owes to another waiter of the resource.
func (w *waiter) Leave(acquired bool) {
	w.left.Do(func() {
		close(w.stop)
		w.p.listen.unsubscribe(w.sub)
		w.p.mu.Lock()
		if m := w.p.waiters[w.resource]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(w.p.waiters, w.resource)
			}
		}
		w.p.mu.Unlock()
		if !acquired && w.owe.Load() {
			w.p.wakeOne(w.resource, w)
		}
	})
}

// PutRecord writes value as f's record while f's grant holds the lock.
func (p *pgBackend) PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error {
	err := p.setRecord(ctx, f.Resource, f.Holder, f.Token, value, linger)
	var newer *recordNewerError
	if errors.As(err, &newer) {
		return &lockbackend.NewerRecordError{Resource: f.Resource, Token: newer.token}
	}
	if err != nil {
		return unknown(ctx, err)
	}
	return nil
}

// KeepRecord keeps f's record as long as its lock and linger more.
func (p *pgBackend) KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error {
	return p.keepRecord(ctx, f.Resource, f.Holder, f.Token, linger)
}

// ReadRecord returns the record of the grant that holds resource's lock.
func (p *pgBackend) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	rec, ok, err := p.record(ctx, resource)
	if err != nil {
		return lockbackend.Record{}, err
	}
	if !ok {
		return lockbackend.Record{}, fmt.Errorf("pglock: ReadRecord %q: %w", resource, lockbackend.ErrNoRecord)
	}
	return lockbackend.Record{Value: rec.value, Token: rec.token}, nil
}

// WatchRecord sends a zero Record (read the record) each time a record
// may have been written for resource, until ctx ends: at each NOTIFY of
// its mark and each reconnect of the listener. It never passes on what a
// notification says: anyone can send one, and another schema's lock of
// the same name shares the channel.
func (p *pgBackend) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	out := make(chan lockbackend.Record, 1)
	s := p.watchRecord(resource)
	go func() {
		defer close(out)
		if s == nil {
			<-ctx.Done()
			return
		}
		defer p.unwatch(s)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.c:
				// A doorbell only: NOTIFY channels are the database's, so
				// another schema's lock of the same name, or any role at
				// all, may ring it; the record is read from this
				// schema's table (a zero Record says: read it).
				select {
				case out <- lockbackend.Record{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
