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
	s.life.stop = make(chan struct{})
	s.life.renewDone = make(chan struct{})
	s.life.mu.Lock()
	done := s.watch() // the expiry timer ends the lease even while a renewal hangs
	s.life.mu.Unlock()
	s.l.renewers.Add(1)
	go func() {
		defer s.l.renewers.Done()
		defer close(s.life.renewDone)
		s.renew(ttl, done)
	}()
}

// renew extends the lease to ttl every third of ttl. A refusal ends the
// lease (extend does that); a failure is retried sooner, and if failures
// last until the known expiry, the expiry timer ends the lease even while a
// renewal call is still hanging.
func (s *Lease) renew(ttl time.Duration, done <-chan struct{}) {
	period := max(ttl/3, time.Millisecond)
	t := time.NewTimer(period)
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
		s.life.mu.Unlock()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := s.extend(ctx, ttl)
		cancel()
		s.l.tel.renewed(err)
		if errors.Is(err, ErrNotHeld) {
			return
		}
		next := period
		if err != nil {
			// Redis did not answer: try again while the lease still runs.
			next = min(period, max(time.Until(deadline)/3, time.Millisecond))
		}
		t.Reset(next)
	}
}
