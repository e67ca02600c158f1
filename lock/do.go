package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Do acquires resource (waiting as [Locker.Acquire] does), runs fn with the
// lease's fence, releases the lease and returns fn's error. The lease is
// renewed for as long as fn runs ([AutoRenew] is implied), so ttl is the
// window in which a crashed or cut-off holder is detected, not a limit on fn.
//
// fn runs with a context that is cancelled, with the lease's [Lease.Err] as
// its cause (see [context.Cause]), as soon as the lease is known to be lost:
// a renewal refused, or the backend unreachable until the lease ran out. fn must
// still present the fence to storage with every read and write it makes:
// only storage admission keeps a late write out. If the lease was lost
// while fn ran, Do returns an error matching [ErrNotHeld] (joined to fn's
// error, if any): fn's fenced writes are still safe, but it did not run
// alone to the end.
//
// If fn panics (or calls runtime.Goexit), Do releases the lease and stops
// its renewal, then lets the panic continue with its original value. The
// release runs even if ctx has ended: then, as [Lease.Release] does, Do
// ends the lease at once and leaves the release to the background (which
// [Locker.Close] waits for), so it returns by ctx's deadline with fn's
// result. ctx bounds the wait for the lock and is the parent of fn's
// context.
func (l *Locker) Do(ctx context.Context, resource string, ttl time.Duration, fn func(ctx context.Context, f fence.Fence) error, opts ...AcquireOption) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", errInvalid)
	}
	lease, err := l.Acquire(ctx, resource, ttl, append(slices.Clip(opts), AutoRenew())...)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	stopWatch := lease.whenEnded(func(err error) { cancel(err) })
	returned := false
	defer func() {
		stopWatch()
		cancel(nil)
		if !returned {
			// fn panicked or called runtime.Goexit: free the lock for the
			// next holder before the panic goes on up the stack.
			_ = lease.Release(ctx)
		}
	}()
	fnErr := fn(fnCtx, lease.Fence())
	returned = true
	lostErr := lease.Err() // non-nil here only if the lease was lost during fn

	relErr := lease.Release(ctx)
	if err := ctx.Err(); err != nil && errors.Is(relErr, err) {
		relErr = nil // released in the background: fn's outcome stands
	}
	switch {
	case fnErr != nil && lostErr != nil && !errors.Is(fnErr, ErrNotHeld):
		return fmt.Errorf("%w; %w", fnErr, lostErr)
	case fnErr != nil:
		return fnErr
	case lostErr != nil:
		// Reported even if the release found the lock still held: a renewal
		// that reached Redis late may have extended a lease that this
		// process had already given up for lost.
		return lostErr
	}
	return relErr
}
