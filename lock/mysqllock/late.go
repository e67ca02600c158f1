package mysqllock

import (
	"context"
	"time"
)

// Late grants. A grant's request may reach the server after its caller
// gave up: held in the network past the caller's deadline, or past a retry
// of it on another connection that was granted and then released. The
// cleanup kills the request's session first, so that it can run nothing
// when it arrives; but a cleanup that cannot reach the server (a link
// down for longer than cleanupBound) kills nothing, and the request, once
// the link is back, would grant the lock to a holder nobody has, for its
// whole lease. So every grant is sent with a deadline on the server's
// clock (no later there than the caller's deadline, or grantWindow after
// the send, is here), past which the procedure changes nothing and the
// fast path's UPDATE matches nothing; and a request whose session could
// not be killed is released again once that deadline has passed, which
// orders the release after any grant the request can still make. A late
// grant therefore stands at most until its deadline plus the release's
// round trip, if the server's clock does not step back.

const (
	// grantWindow bounds how long after it is sent a grant may still be
	// made, for a caller whose context has no earlier deadline; a grant
	// the server reaches later is refused as too late, and sent again
	// while the caller waits.
	grantWindow = 5 * time.Second
	// clockRefresh is how often the mapping of the client's clock onto
	// the server's is read again.
	clockRefresh = 30 * time.Second
	// driftDivisor: deadlines are mapped as if the server's clock ran
	// 1/driftDivisor slower than the client's, so a clock rate error up to
	// that (0.1 %) never makes a server deadline later than the client's.
	driftDivisor = 1000
	// tooLateTries bounds how often one try is sent again after the
	// server answered that its deadline had passed.
	tooLateTries = 3
)

// clockRef maps the client's monotonic clock onto the server's: serverUS
// is the server's clock (µs since the epoch) as a statement read it, local
// the client's time once its reply had come back. The server's clock at
// any later local instant x is at least serverUS + (x - local), because
// the server read it before local.
type clockRef struct {
	serverUS int64
	local    time.Time
}

// serverDeadline maps the local instant at onto the server's clock, in µs:
// a time the server's clock has not passed by the time the client's has
// passed at (within the drift the mapping allows), so a server deadline is
// never later than its client deadline. It reads the server's clock once
// when no mapping is known yet.
func (b *backend) serverDeadline(ctx context.Context, at time.Time) (int64, error) {
	ref := b.clock.Load()
	if ref == nil {
		r, err := b.readClock(ctx)
		if err != nil {
			return 0, err
		}
		ref = r
	} else if time.Since(ref.local) > clockRefresh {
		b.refreshClock()
	}
	d := at.Sub(ref.local)
	d -= max(d, -d) / driftDivisor
	return ref.serverUS + d.Microseconds(), nil
}

// readClock reads the server's clock and keeps the mapping.
func (b *backend) readClock(ctx context.Context) (*clockRef, error) {
	var us int64
	b.sent.Add(1)
	if err := b.db.QueryRowContext(ctx, "SELECT "+nowSQL).Scan(&us); err != nil {
		return nil, err
	}
	ref := &clockRef{serverUS: us, local: time.Now()}
	b.clock.Store(ref)
	return ref, nil
}

// refreshClock reads the server's clock again in the background, once at
// a time.
func (b *backend) refreshClock() {
	if !b.clockBusy.CompareAndSwap(false, true) {
		return
	}
	b.mu.Lock()
	closed := b.closed
	if !closed {
		b.bg.Add(1)
	}
	b.mu.Unlock()
	if closed {
		b.clockBusy.Store(false)
		return
	}
	go func() {
		defer b.bg.Done()
		defer b.clockBusy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		_, _ = b.readClock(ctx)
	}()
}

// giveUp releases holder's grant of resource and its queue entry again,
// once their deadlines have passed, when a request of holder's may still
// grant (see lockbackend.LateRequests). It does not wait.
func (b *backend) giveUp(resource, holder string) {
	late, ok := b.late.Take(resource, holder)
	if !ok || b.noDeadline {
		return
	}
	b.mu.Lock()
	tracked := !b.closed // a Locker closing waits only for what started before
	if tracked {
		b.bg.Add(1)
	}
	b.mu.Unlock()
	go func() {
		if tracked {
			defer b.bg.Done()
		}
		if d := time.Until(late); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			<-t.C // bounded by grantWindow; Close waits for it
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		for attempt := 0; ; attempt++ {
			_, err := b.release(ctx, "Acquire", resource, holder, true)
			if err == nil || ctx.Err() != nil || !b.pause(ctx, attempt+3) {
				return
			}
		}
	}()
}
