package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// Waiting for a release. A waiter whose subscription to the resource's
// channel is confirmed joins the resource's wait queue in Redis with the
// try that is refused, and the release that frees the lock grants it to
// the first live waiter in that queue in the same script, publishing the
// grant (holder, token) on the channel: the waiter has the lock when the
// message arrives, with no round trip of its own. A release that finds
// waiters queued but none live publishes an empty message, and each such
// message wakes one waiter of the Locker to try; with nobody queued there
// is no one to wake (a waiter that is not queued yet tries again once its
// subscription is confirmed), and nothing is published. A Locker's waiters share one subscription
// connection (one per hash slot on a cluster, where sharded pub/sub is
// used; one per resource on a Ring). A channel is subscribed when its first
// waiter arrives and unsubscribed topicLinger after its last one leaves, so
// that a later Acquire of the resource in this process is covered (and
// queues) from its first try.
//
// A waiter counts as registered only once the server has confirmed the
// subscription; only a try made after that is covered by the wake-up or
// queues the waiter, so neither a release nor a grant can slip between a
// refused try and the wait. A waiter that took a wake-up and leaves without
// the lock hands it on, so no wake-up is lost; one that leaves the queue
// takes its entry out, and gives back (hands on) a grant it got meanwhile.
// A queued waiter refreshes its entry every queueRefresh, by trying again,
// and an entry not refreshed for queueLife is skipped, so a waiter that
// vanished is passed over.
//
// Only the first namedPlaces waiters of the queue also try when the
// current lease is due to end: the head at its end, the next ones
// nextInLine and twice that later, in case the waiters ahead vanished; any
// other try would find the lock handed to one of them. A waiter learns its
// place from its own tries and, at once, from every script that changes
// who is first (a grant from the queue, a waiter ahead that took the lock
// or left it): that script names the first waiters and the lease's
// remaining time on the channel. So a waiter that gives up costs the
// others nothing (the next one tries when the lease ends, at once if the
// lock is free), and one that vanished with its entry live costs them the
// lease it is handed plus nextInLine: the next waiter's try hands the lock
// to it, and the next tries again when that lease ends.
//
// Every try respects the queue, also one made before the subscription is
// confirmed: a free lock with live waiters queued ahead goes to the first
// of them. While the subscription is down, waiters retry on the Locker's
// wait strategy, never sleeping past the current lease's remaining time; a
// queued waiter's retry finds a grant made to it.

const (
	// queueRefresh is how often a queued waiter refreshes its entry (see
	// lockbackend.QueueRefresh).
	queueRefresh = lockbackend.QueueRefresh
	// The first waiters of the queue try when the current lease ends, each
	// a little after the one ahead of it: the head at the end, the next
	// ones nextInLine and twice that later, so that a waiter that vanished
	// at the head holds up the others for no more than the lease it is
	// handed and nextInLine, and a live head is rarely raced. The Redis
	// scripts name that many waiters whenever they change who is first.
	nextInLine  = 20 * time.Millisecond
	namedPlaces = 3
)

// acquireWaiting is Acquire: it tries, and after each refusal waits for a
// grant or a release message, the current lease's end, the time to
// refresh its queue entry, or (without a confirmed subscription) the wait
// strategy's delay, whichever comes first.
func (l *Locker) acquireWaiting(ctx context.Context, resource string, ttl time.Duration, cfg acquireConfig) (lease *Lease, err error) {
	// Every try respects the queue, whether or not it can join it yet: a
	// free lock with live waiters queued ahead goes to the first of them.
	a := attempt{holder: fence.NewHolder(), ordered: true, place: -1}
	var w lockbackend.Waiter
	if l.queue != nil {
		// Joining a channel that other waiters keep subscribed costs
		// nothing and makes even the first try a registered one.
		w = l.queue.Join(resource, a.holder, false)
		defer func() {
			if w != nil {
				w.Leave(lease != nil)
			}
		}()
	}
	defer func() {
		if lease == nil && a.queued() {
			// Out of the queue; a grant made to this holder meanwhile is
			// given back and handed on.
			acq := ""
			if cfg.owner != "" {
				acq = a.holder
			}
			l.cleanup(ctx, resource, a.holder, acq)
		}
	}()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	fallbacks := 0
	for {
		if w != nil && l.isClosing() {
			// Close stopped the subscription for good, so no grant message
			// can reach this waiter any more: it leaves the queue (a grant
			// made to it meanwhile is given back and handed on) and waits
			// by timed retries that respect the queue without joining it,
			// as with WithWait, instead of holding a place that a release
			// would hand it without telling it.
			w.Leave(false)
			w = nil
			if a.queued() {
				acq := ""
				if cfg.owner != "" {
					acq = a.holder
				}
				l.cleanup(ctx, resource, a.holder, acq)
				a.ref, a.place, a.head = 0, -1, false
				// The tries from here on go under a holder of their own: a
				// release may have handed the lock to the queued one, and
				// the cleanup gives that grant back, maybe later, in the
				// background, when its reply was lost. Under the same
				// holder a try could take that grant for its own just
				// before the cleanup gives it back, and believe it holds a
				// lock that is free or handed on.
				a.holder = fence.NewHolder()
			}
		}
		var ready, lost <-chan struct{}
		confirmed := false
		if w != nil {
			ready, lost, confirmed = w.State()
		}
		// Queue only on a try the subscription covers, so that the grant's
		// message cannot be missed; once queued, every try refreshes the
		// entry.
		a.queue = w != nil && (confirmed || a.queued())
		lease, err = l.tryAcquire(ctx, resource, ttl, cfg, &a)
		var na *NotAcquiredError
		if !errors.As(err, &na) {
			return lease, err
		}
		if w != nil {
			w.Owe(false)
		}
		if w == nil && l.queue != nil && !l.isClosing() {
			if w = l.queue.Join(resource, a.holder, true); w != nil {
				if ready, lost, confirmed = w.State(); confirmed {
					continue // someone else's subscription covers a try from now on
				}
			}
		}
		var d time.Duration
		switch {
		case confirmed:
			// Only the first waiters of the queue have a reason to try
			// when the current lease ends (a holder that vanished): the
			// head at its end, the next ones a little later each, in case
			// the head vanished too (their try hands the lock to it, if its
			// entry is live, or passes it over). Any other waiter's try
			// would find the lock handed to one of them; the others only
			// refresh their entry, once a second.
			d = queueRefresh
			if a.place >= 0 && a.place < namedPlaces && na.Remaining >= 0 {
				d = min(d, na.Remaining+time.Duration(a.place)*nextInLine)
			}
		default:
			d = l.wait.Delay(fallbacks, na.Remaining)
			fallbacks++
			if na.Remaining >= 0 && d > na.Remaining {
				d = na.Remaining
			}
		}
		var (
			wake, edge, closing <-chan struct{}
			granted             <-chan lockbackend.HandOver
			placed              <-chan lockbackend.Place
		)
		if w != nil {
			// Close wakes a waiter, which then leaves the queue (above).
			wake, granted, placed, closing = w.Wake(), w.Granted(), w.Placed(), l.closing
			if confirmed {
				edge = lost // back to timed retries
			} else {
				edge = ready // registered from now on: try again
			}
		}
		due := time.Now().Add(d)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("lock: acquire %q: %w", resource, ctx.Err())
			case <-timer.C:
			case <-wake:
				w.Owe(true)
			case <-edge:
			case <-closing:
			case g := <-granted:
				if lease = l.handedOver(resource, ttl, cfg, &a, g); lease != nil {
					return lease, nil
				}
			case m := <-placed:
				// A script changed who is first in the queue (a grant, or a
				// waiter ahead took the lock or left) and named this waiter
				// among the first: it tries when the lease it names ends (at
				// once if the lock is free), a little later behind the
				// head, instead of at its refresh.
				if at, ok := tryAt(m); ok && at.Before(due) {
					due = at
					timer.Reset(time.Until(at))
				}
				continue wait
			}
			break
		}
	}
}

// handedOver is the lease a release granted to a's holder, as its message
// g tells, or nil when g cannot be dated (the next try finds the grant).
//
// The grant came after the release read the holder's entry as refreshed at
// g.Ref, and g.Age after that refresh on the server's clock; the try that
// made that refresh was sent no later than it ran. So a.sent + g.Age is no
// later than the grant, and the lease is dated from there. A message about
// an older entry than a's last refresh is stale: that refresh found the
// lock in other hands, so the grant it names is gone.
func (l *Locker) handedOver(resource string, ttl time.Duration, cfg acquireConfig, a *attempt, g lockbackend.HandOver) *Lease {
	if g.Ref != a.ref {
		return nil
	}
	req := lockbackend.Request{Resource: resource, TTL: ttl, Holder: a.holder, Owner: cfg.owner, Ordered: true, Queue: true}
	lease := &Lease{l: l, hold: l.queue.Adopt(&req, g)}
	l.grantLease(lease, fence.Fence{Resource: resource, Token: g.Token, Holder: a.holder}, a.sent.Add(g.Age), ttl, ttl, cfg)
	return lease
}

// tryAt is when the waiter at m's place tries, or ok false when it has no
// reason to before its refresh (the lease has no expiry): the head when
// the current lease ends (at once if the lock is free), the next ones
// nextInLine apart after it.
func tryAt(m lockbackend.Place) (at time.Time, ok bool) {
	switch {
	case m.Remaining == lockbackend.NoExpiry:
		return time.Time{}, false
	case m.Remaining < 0:
		return m.At.Add(time.Duration(m.Place) * nextInLine), true
	}
	return m.At.Add(m.Remaining + time.Duration(m.Place)*nextInLine), true
}

// isClosing reports whether Close has been called.
func (l *Locker) isClosing() bool {
	select {
	case <-l.closing:
		return true
	default:
		return false
	}
}
