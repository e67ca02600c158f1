package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// Lease is one grant of a resource's lock. Its fence (resource, token,
// holder) is fixed for the life of the grant: extending the lease keeps it.
// A Lease is safe for concurrent use. [Lease.Done] and [Lease.Err] say when
// and why it ended.
type Lease struct {
	l       *Locker
	hold    lockbackend.Hold    // the backend's record of the grant
	req     lockbackend.Request // the try that made the grant (see Locker.tryAcquire)
	granted time.Time           // when the grant was sent, for the hold-time metric
	f       fence.Fence
	life    life
}

// Fence returns what the holder presents to storage with each read and
// write made under this lease.
func (s *Lease) Fence() fence.Fence { return s.f }

// Release gives up the lock if this grant still holds it, in one round trip.
// It never deletes another holder's lock: if the lease has expired (or was
// released), it returns [ErrNotHeld] and changes nothing. The token state is
// kept for the token retention, so the next grant's token is higher. ctx
// bounds the round trip. If the client retries a release whose reply was
// lost, the retry reports ErrNotHeld although the first run released the
// lock: either way the lock is no longer this lease's. (Telling the two
// apart would cost a record per release for the client's retry window;
// nothing a caller does next depends on the difference.)
//
// For a lease acquired with [Owner], Release gives up this acquisition's
// hold only; the lock is freed with the owner's last hold. A client retry
// of a hold's release that is not the last one is recognised and reports
// success.
//
// The release that frees the lock hands it to the first live waiter queued
// in [Locker.Acquire] and announces the grant on the resource's
// [RedisNames.ReleaseChannel], in the same script; with nobody queued it only
// deletes the lock. Release stops the lease's renewal, if any, and closes
// [Lease.Done], whatever its outcome; releasing a lease again after a
// release that reached Redis returns ErrNotHeld without a round trip.
//
// Release returns by ctx's deadline. When ctx has already ended (the common
// defer lease.Release(reqCtx) after the request's context ended), or ends
// before the release is known to have reached Redis, Release still stops
// renewal and ends the lease at once, and then returns an error matching
// ctx.Err() while the release goes on in the background with a short
// timeout of its own; [Locker.Close] waits for it. When the release's
// reply is lost on a live context (a client that does not retry, a reset
// connection), Release ends the lease as well, returns that error, and
// sends the release again in the background the same way, so that the
// lock is not left to its lease's end.
func (s *Lease) Release(ctx context.Context) (err error) {
	if ctx == nil {
		return fmt.Errorf("%w: release %q: nil context", errInvalid, s.f.Resource)
	}
	ctx, span := s.l.tel.startLeaseOp(ctx, "fencekit.lock.release", s.f)
	defer func() { s.l.tel.endLeaseOp(span, err) }()
	if s.gone() {
		return fmt.Errorf("%w: release %q token %d: already released", ErrNotHeld, s.f.Resource, s.f.Token)
	}
	s.stopRenewal()
	if s.awaitRenewal(ctx) && ctx.Err() == nil {
		if err := s.release(ctx); !errors.Is(err, errReleaseUnknown) {
			return err
		}
	}
	// ctx ended before the release was known to reach Redis: end the lease
	// now and release in the background.
	cause := fmt.Errorf("lock: release %q: %w", s.f.Resource, ctx.Err())
	s.end(fmt.Errorf("%w (%w; released in the background)", releasedError{}, cause), false)
	s.l.background(ctx, func(ctx context.Context) {
		s.awaitRenewal(ctx)
		_ = s.release(ctx)
	})
	return cause
}

// errReleaseUnknown is release's error when ctx ended before the release's
// reply came.
var errReleaseUnknown = errors.New("release outcome unknown")

// release runs the release on the backend and ends the lease with its
// outcome. It returns an error matching errReleaseUnknown, and leaves the
// lease as it was, when ctx ended before the reply came.
func (s *Lease) release(ctx context.Context) error {
	err := s.l.b.Release(ctx, s.hold)
	switch {
	case err == nil:
		s.end(releasedError{}, true)
		return nil
	case errors.Is(err, ErrNotHeld):
		err = s.notHeld("release", err)
		s.end(err, true)
		return err
	case ctx.Err() != nil && errors.Is(err, lockbackend.ErrReplyLost):
		return fmt.Errorf("%w: %w", errReleaseUnknown, err)
	case errors.Is(err, lockbackend.ErrReplyLost):
		// The call failed on a live context (a client that does not
		// retry, a reset connection, a read that timed out just before
		// ctx did): the release may never have reached the server. End
		// the lease and send the release again in the background; the
		// script is safe to repeat (a release that did run finds the
		// lock no longer this grant's).
		s.end(fmt.Errorf("%w (the release's reply was lost: %w; released again in the background)", releasedError{}, err), false)
		s.l.background(ctx, s.releaseAgain)
		return err
	}
	s.end(fmt.Errorf("%w (the release failed: %w)", releasedError{}, err), false)
	return err
}

// releaseAgain sends a release whose reply was lost again, while ctx
// lasts, until one reply comes back.
func (s *Lease) releaseAgain(ctx context.Context) {
	for ctx.Err() == nil {
		if err := s.l.b.Release(ctx, s.hold); !errors.Is(err, lockbackend.ErrReplyLost) {
			return
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// notHeld is the error of op finding the lease not held, from the
// backend's err (ErrNotHeld, or an error matching it that says more).
func (s *Lease) notHeld(op string, err error) error {
	more := ""
	if err != ErrNotHeld {
		more = ": " + strings.TrimPrefix(strings.TrimPrefix(err.Error(), ErrNotHeld.Error()), ": ")
	}
	return fmt.Errorf("%w: %s %q token %d%s", ErrNotHeld, op, s.f.Resource, s.f.Token, more)
}

// Extend lengthens the lease to at least ttl from now if this grant still
// holds the lock; the token is unchanged. The lock then expires at the
// later of its current expiry and ttl from now: an extension never
// shortens a lock, so neither a short ttl (cutting another hold of an
// [Owner]'s lock) nor an earlier extension that reaches Redis late can
// take away time that a holder was told it had. [Lease.Validity] counts
// what the lock has after the call. To give a lock up early, release it.
//
// Extend returns [ErrNotHeld] and changes nothing when the lease has
// already been lost, and then ends the lease ([Lease.Done] closes). ctx
// bounds the round trip. As for [Locker.TryAcquire], a fraction of a
// millisecond of ttl is dropped.
func (s *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	ttl = wholeMS(ttl)
	if err := checkCall(ctx, "extend", s.f.Resource); err != nil {
		return err
	}
	ctx, span := s.l.tel.startLeaseOp(ctx, "fencekit.lock.extend", s.f)
	err := s.extend(ctx, ttl)
	if err == nil {
		s.life.mu.Lock()
		s.life.ttl = ttl // renewal keeps the lease at this ttl from now on
		s.life.mu.Unlock()
	}
	s.l.tel.endLeaseOp(span, err)
	return err
}

// extend runs one extension at a time per lease. Two in flight at once
// (an Extend and a renewal) could reach Redis in one order and reply in the
// other: the lease would then count on the expiry of the call that replied
// last while Redis holds the one that arrived last.
func (s *Lease) extend(ctx context.Context, ttl time.Duration) error {
	s.life.mu.Lock()
	if s.life.extending == nil {
		s.life.extending = make(chan struct{}, 1)
	}
	sem := s.life.extending
	s.life.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("lock: extend %q: waiting for the extension in flight: %w", s.f.Resource, ctx.Err())
	}
	defer func() { <-sem }()
	sent := time.Now()
	known, err := s.l.b.Extend(ctx, s.hold, ttl)
	if errors.Is(err, ErrNotHeld) {
		err = s.notHeld("extend", err)
		s.lost(err)
		return err
	}
	if err != nil {
		return err
	}
	// The backend counts known from a moment after sent.
	s.extended(sent, known)
	return nil
}

// TTL returns the lease's remaining time as the server sees it (on
// Redlock, as a quorum holds it, less the drift allowance), or [ErrNotHeld]
// when this grant no longer holds the lock (and then ends the lease, as
// [Lease.Done] tells). ctx bounds the round trip.
func (s *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if err := checkCall(ctx, "ttl", s.f.Resource); err != nil {
		return 0, err
	}
	d, err := s.l.b.TTL(ctx, s.hold)
	if errors.Is(err, ErrNotHeld) {
		err = s.notHeld("ttl", err)
		s.lost(err)
		return 0, err
	}
	return d, err
}
