package lock

import (
	"context"
	"time"
)

// cleanupTimeout bounds each cleanup that outlives the call that needed it:
// the release that follows an acquisition whose reply was lost, a waiter
// leaving the queue after its context ended, a release asked for with an
// ended context.
const cleanupTimeout = 2 * time.Second

// background runs f in a goroutine with a context of its own, which keeps
// parent's values but not its cancellation and ends after cleanupTimeout:
// work that must still be done after the caller's context ended, and that
// the caller must not wait for. [Locker.Close] waits for every such
// goroutine started before it.
func (l *Locker) background(parent context.Context, f func(ctx context.Context)) {
	l.renewMu.Lock()
	tracked := !l.closed
	if tracked {
		l.cleanups.Add(1)
	}
	l.renewMu.Unlock()
	go func() {
		if tracked {
			defer l.cleanups.Done()
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), cleanupTimeout)
		defer cancel()
		f(ctx)
	}()
}
