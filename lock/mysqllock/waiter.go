package mysqllock

import (
	"sync"
	"sync/atomic"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// Join registers a waiter for resource's hand-overs.
func (b *backend) Join(resource, holder string, create bool) lockbackend.Waiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.bell == nil {
		return nil
	}
	m := b.waiters[resource]
	if m == nil {
		if !create {
			return nil
		}
		m = make(map[*waiter]struct{})
		b.waiters[resource] = m
	}
	w := &waiter{
		b: b, resource: resource, holder: holder,
		wake:    make(chan struct{}, 1),
		granted: make(chan lockbackend.HandOver, 1),
		placed:  make(chan lockbackend.Place, 1),
	}
	m[w] = struct{}{}
	b.bell.use()
	return w
}

// Adopt makes the Hold of a grant a release handed to req.Holder.
func (b *backend) Adopt(req *lockbackend.Request, _ lockbackend.HandOver) lockbackend.Hold {
	return hold{req.Resource, req.Holder}
}

// waiting lists the resources the Locker's waiters wait for.
func (b *backend) waiting() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.waiters))
	for r := range b.waiters {
		out = append(out, r)
	}
	return out
}

// handedOver tells holder's waiter of resource, if it is one of the
// Locker's, that it was handed the lock.
func (b *backend) handedOver(resource, holder string, g lockbackend.HandOver) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for w := range b.waiters[resource] {
		if w.holder == holder {
			put(w.granted, g)
		}
	}
}

// wakeOne passes a wake-up to one waiter of resource other than except.
func (b *backend) wakeOne(resource string, except *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for w := range b.waiters[resource] {
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

// waiter is one waiting acquisition's view of its resource's hand-overs.
type waiter struct {
	b                *backend
	resource, holder string
	wake             chan struct{}
	granted          chan lockbackend.HandOver
	placed           chan lockbackend.Place
	owe              atomic.Bool
	left             sync.Once
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

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// State: hand-overs are covered while the doorbell is up, since a try
// made then names it in the waiter's queue entry.
func (w *waiter) State() (ready, lost <-chan struct{}, confirmed bool) {
	up, upC, downC := w.b.bell.state()
	if up {
		return closedChan, downC, true
	}
	return upC, nil, false
}

func (w *waiter) Wake() <-chan struct{}                { return w.wake }
func (w *waiter) Granted() <-chan lockbackend.HandOver { return w.granted }
func (w *waiter) Placed() <-chan lockbackend.Place     { return w.placed }
func (w *waiter) Owe(b bool)                           { w.owe.Store(b) }

// Leave removes the waiter; one that leaves without the lock passes a
// wake-up it owes to another waiter of the resource.
func (w *waiter) Leave(acquired bool) {
	w.left.Do(func() {
		w.b.mu.Lock()
		if m := w.b.waiters[w.resource]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(w.b.waiters, w.resource)
			}
		}
		w.b.mu.Unlock()
		w.b.bell.unuse()
		if !acquired && w.owe.Load() {
			w.b.wakeOne(w.resource, w)
		}
	})
}
