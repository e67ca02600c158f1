package lock

import (
	"context"
	"errors"
	"time"
)

// startRenewal runs the lease's renewal in a goroutine that returns when the
// lease ends, when its release begins, or when the Locker closes.
func (s *Lease) startRenewal(ttl time.Duration) {
	s.l.renewMu.Lock()
	defer s.l.renewMu.Unlock()
	if s.l.closed {
		// The Locker is closed: no goroutine may start. The lease runs out
		// its TTL, and Done closes then.
		s.life.mu.Lock()
		s.watch()
		s.life.mu.Unlock()
		return
	}
	// Close cancels l.stop, and with it a renewal call in flight.
	ctx, cancel := context.WithCancel(s.l.stop)
	s.life.stop = make(chan struct{})
	s.life.renewDone = make(chan struct{})
	s.life.renewCancel = cancel
	s.life.mu.Lock()
	done := s.watch() // the expiry timer ends the lease even while a renewal hangs
	s.life.mu.Unlock()
	s.l.renewers.Add(1)
	go func() {
		defer s.l.renewers.Done()
		defer close(s.life.renewDone)
		defer cancel()
		s.renew(ctx, ttl, done)
	}()
}

// renewAfter is how long to wait before renewing a lease of ttl that is
// known held for left more. After a grant or a successful renewal it is
// until two thirds of ttl are left: a third of ttl for a lease just granted
// or extended, and at once for one that starts with less (a grant that
// reached its waiter late). After a failed renewal it is a third of what
// is left, so tries come ever sooner while the lease still runs.
func renewAfter(ttl, left time.Duration, failed bool) time.Duration {
	if failed {
		return max(left/3, time.Millisecond)
	}
	return max(left-(ttl-ttl/3), 0)
}

// renew extends the lease to ttl (or to the ttl of the last Extend)
// whenever only two thirds of it are left (see renewAfter). A refusal ends the lease (extend does that); a failure
// is retried sooner, and if failures last until the known expiry, the
// expiry timer ends the lease even while a renewal call is still hanging.
// Stopping renewal cancels ctx, and with it a renewal in flight.
func (s *Lease) renew(ctx context.Context, ttl time.Duration, done <-chan struct{}) {
	t := time.NewTimer(renewAfter(ttl, s.left(), false))
	defer t.Stop()
	for {
		select {
		case <-s.life.stop:
			return
		case <-done:
			return
		case <-s.l.closing:
			return
		case <-t.C:
		}
		s.life.mu.Lock()
		deadline := s.life.deadline
		if s.life.ttl > 0 {
			ttl = s.life.ttl // an Extend set the lease's ttl: keep it
		}
		s.life.mu.Unlock()
		cctx, cancel := context.WithDeadline(ctx, deadline)
		err := s.extend(cctx, ttl)
		cancel()
		s.l.tel.renewed(err)
		if errors.Is(err, ErrNotHeld) || ctx.Err() != nil {
			return
		}
		s.life.mu.Lock()
		if s.life.ttl > 0 {
			ttl = s.life.ttl
		}
		s.life.mu.Unlock()
		t.Reset(renewAfter(ttl, s.left(), err != nil))
	}
}

// left is how long the lease is still known held, on the local clock.
func (s *Lease) left() time.Duration {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	return time.Until(s.life.deadline)
}
