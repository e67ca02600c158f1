package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// life is what a process knows about whether its lease is still held: it
// ends once, on release or on the first sign of loss, and then stays ended.
// Its channel and expiry timer are made only when someone watches (Done,
// Do, renewal), so a lease that is only acquired and released pays for
// neither.
type life struct {
	mu       sync.Mutex
	ended    bool
	err      error         // why it ended; nil while held
	released bool          // a release reached Redis and the hold is gone
	done     chan struct{} // made on first watch; closed when the lease ends
	deadline time.Time     // known expiry; zero when none is tracked
	expiry   *time.Timer   // ends the lease at deadline; armed on first watch
	onEnd    map[*func(error)]struct{}

	stopOnce    sync.Once
	stop        chan struct{} // closed to stop renewal; nil without renewal
	renewDone   chan struct{} // closed when renewal has stopped; nil without renewal
	renewCancel func()        // cancels a renewal call in flight; nil without renewal

	ttl       time.Duration // the ttl of the last Extend, which renewal keeps; 0: the grant's
	extending chan struct{} // held by the one extension in flight (Extend or renewal); made on first use
}

// closedChan is the Done channel of a lease that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// releasedError is Err after a release: it matches ErrNotHeld and
// ErrReleased, and costs nothing to return.
type releasedError struct{}

func (releasedError) Error() string { return "lock: lease released" }

func (releasedError) Is(target error) bool { return target == ErrNotHeld || target == ErrReleased }

// start records the lease's known expiry. A lease that tracks it ends on its
// own once sent+ttl has passed without a successful extension: sent is
// taken before the grant was sent, so that moment is never later than the
// one at which Redis lets the lock go.
func (s *Lease) start(sent time.Time, ttl time.Duration, trackExpiry bool) {
	if trackExpiry {
		s.life.deadline = sent.Add(ttl)
	}
}

// watch makes the done channel, arms the expiry timer and, for a hold
// whose backend signals a loss, ends the lease when it does; the caller
// holds s.life.mu.
func (s *Lease) watch() chan struct{} {
	if s.life.done == nil {
		if s.life.ended {
			s.life.done = closedChan
		} else {
			s.life.done = make(chan struct{})
			if !s.life.deadline.IsZero() {
				s.life.expiry = time.AfterFunc(time.Until(s.life.deadline), s.expired)
			}
			if ls, ok := s.hold.(lockbackend.LossSignal); ok {
				go s.endWhenLost(ls.Lost(), s.life.done)
			}
		}
	}
	return s.life.done
}

// endWhenLost ends the lease when its backend signals the grant lost, or
// returns once the lease has ended otherwise.
func (s *Lease) endWhenLost(lost <-chan struct{}, done <-chan struct{}) {
	select {
	case <-lost:
		s.lostByBackend()
	case <-done:
	}
}

// checkLost ends the lease at once if its backend has signalled the grant
// lost, for the calls (Validity, Err) that may come without a watch.
func (s *Lease) checkLost() {
	ls, ok := s.hold.(lockbackend.LossSignal)
	if !ok {
		return
	}
	select {
	case <-ls.Lost():
		s.lostByBackend()
	default:
	}
}

func (s *Lease) lostByBackend() {
	s.end(fmt.Errorf("%w: %q token %d: the %s backend found the grant gone (its lease revoked or its key lost)", ErrNotHeld, s.f.Resource, s.f.Token, s.l.info.Name), false)
}

func (s *Lease) expired() {
	s.life.mu.Lock()
	late := time.Until(s.life.deadline) > 0 // extended since the timer fired
	s.life.mu.Unlock()
	if late {
		return
	}
	s.end(fmt.Errorf("%w: %q token %d: the lease ran out without a successful renewal", ErrNotHeld, s.f.Resource, s.f.Token), false)
}

// extended moves the known expiry to sent+ttl after a successful extension.
func (s *Lease) extended(sent time.Time, ttl time.Duration) {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	if s.life.ended || s.life.deadline.IsZero() {
		return
	}
	s.life.deadline = sent.Add(ttl)
	if s.life.expiry != nil {
		s.life.expiry.Reset(time.Until(s.life.deadline))
	}
}

// end records why the lease ended, closes Done and stops renewal. Only the
// first call counts. released says the hold is known to be gone because
// this lease released it.
func (s *Lease) end(err error, released bool) {
	s.life.mu.Lock()
	if released {
		s.life.released = true
	}
	if s.life.ended {
		s.life.mu.Unlock()
		return
	}
	s.life.ended, s.life.err = true, err
	s.l.tel.ended(s.granted, err)
	if s.life.expiry != nil {
		s.life.expiry.Stop()
	}
	if s.life.done != nil {
		close(s.life.done)
	}
	var fns []func(error)
	for f := range s.life.onEnd {
		fns = append(fns, *f)
	}
	s.life.onEnd = nil
	s.life.mu.Unlock()
	s.stopRenewal()
	for _, f := range fns {
		f(err)
	}
}

// whenEnded calls f with the lease's error once the lease ends (at once if
// it has), unless the returned function is called first.
func (s *Lease) whenEnded(f func(error)) (stop func()) {
	s.life.mu.Lock()
	s.watch()
	if s.life.ended {
		err := s.life.err
		s.life.mu.Unlock()
		f(err)
		return func() {}
	}
	if s.life.onEnd == nil {
		s.life.onEnd = make(map[*func(error)]struct{})
	}
	key := &f
	s.life.onEnd[key] = struct{}{}
	s.life.mu.Unlock()
	return func() {
		s.life.mu.Lock()
		delete(s.life.onEnd, key)
		s.life.mu.Unlock()
	}
}

// stopRenewal stops the renewal goroutine, if any, cancelling a renewal
// call in flight, without waiting for it to return.
func (s *Lease) stopRenewal() {
	if s.life.stop == nil {
		return
	}
	s.life.stopOnce.Do(func() {
		close(s.life.stop)
		s.life.renewCancel()
	})
}

// awaitRenewal waits until the renewal goroutine, if any, has returned, or
// until ctx ends; it reports whether renewal is over.
func (s *Lease) awaitRenewal(ctx context.Context) bool {
	if s.life.renewDone == nil {
		return true
	}
	select {
	case <-s.life.renewDone:
		return true
	case <-ctx.Done():
		return false
	}
}

// gone reports whether a release of this lease already took its hold away,
// so that releasing again must report ErrNotHeld without asking Redis.
func (s *Lease) gone() bool {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	return s.life.released
}

// lost ends the lease if err says Redis no longer holds it for this grant.
func (s *Lease) lost(err error) {
	if errors.Is(err, ErrNotHeld) {
		s.end(err, false)
	}
}

// Done returns a channel that is closed when the lease ends: when
// [Lease.Release] is called, or as soon as the lease is known to be lost
// (a renewal refused, [Lease.Extend] or [Lease.TTL] finding it not held,
// its TTL run out on the local clock without a successful extension, or a
// backend that learns of a loss by itself finding the grant gone: on etcd,
// the session's lease revoked or the key lost, within a keep-alive interval). Stop
// work made under the lease when it closes; [Lease.Err] says why it closed.
//
// A lease acquired with [Owner] and without [AutoRenew] shares its lock with
// the owner's other holds, which may extend it; it does not end by the clock,
// only on Release or when Redis reports it not held.
func (s *Lease) Done() <-chan struct{} {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	return s.watch()
}

// Err returns nil while the lease is held. Once it was lost, it returns an
// error matching [ErrNotHeld] that says how. After [Lease.Release], it
// returns an error matching both [ErrNotHeld] and [ErrReleased], unless the
// lease had been lost before (then the loss is reported).
func (s *Lease) Err() error {
	s.checkLost()
	s.life.mu.Lock()
	ended, err, deadline := s.life.ended, s.life.err, s.life.deadline
	s.life.mu.Unlock()
	if !ended && !deadline.IsZero() && time.Until(deadline) <= 0 {
		s.expired()
		return s.Err()
	}
	return err
}
