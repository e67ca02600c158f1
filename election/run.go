package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// Run campaigns with value, runs fn with the term's fence while this
// candidate leads, resigns when fn returns, and campaigns again, until ctx
// ends, as client-go's elector loops. fn's ctx ends, with the term's
// [Term.Err] as its cause (see context.Cause), when the term is lost, and
// it ends before any other candidate can be elected (see [Term.Done]);
// fn must still present the fence with every write it makes.
//
// A campaign that fails because the lock's server cannot be reached (or any error but
// those below) is retried with backoff (from 10ms, doubling, to the TTL or
// a second, whichever is less, with jitter), not returned. Run returns:
//   - an error matching ctx.Err() once ctx ends;
//   - fn's own error, unchanged, when fn returns one that is not the
//     term's end (see below);
//   - an error matching [fence.ErrInvalid] for bad arguments,
//     [fence.ErrWrongType] when a key of the election holds another type,
//     [lock.ErrTokensExhausted], and [ErrClosed] once the Locker is closed.
//
// An error from fn that matches [ErrLost], context.Canceled after the term
// was lost, or [fence.ErrStale] (storage refused the term's fence: a newer
// term has written there, so return the store's error as it is) ends the
// term, not Run: Run resigns and campaigns again (after a stale refusal,
// with the backoff above, since the next term's fence may be refused too
// until the tokens pass the store's mark). When fn returns nil,
// Run resigns and campaigns again at the back of the queue, so that queued
// candidates take turns. If fn panics, Run resigns and lets the panic
// continue. The resignation is sent even after ctx has ended, bounded by
// the TTL; after a lost term there is nothing to resign, and Run goes on
// at once.
func Run(ctx context.Context, e *Election, value string, fn func(ctx context.Context, f fence.Fence) error) error {
	switch {
	case ctx == nil:
		return invalid("Run", "nil context")
	case e == nil:
		return invalid("Run", "nil Election")
	case fn == nil:
		return invalid("Run", "nil function")
	}
	if err := checkValue("Run", value); err != nil {
		return err
	}
	const first = 10 * time.Millisecond
	limit := min(e.ttl, time.Second)
	wait := first
	backoff := func() {
		sleep := wait/2 + rand.N(wait/2+1)
		wait = min(2*wait, limit)
		select {
		case <-ctx.Done():
		case <-time.After(sleep):
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("election: Run %q: %w", e.name, err)
		}
		t, err := e.Campaign(ctx, value)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("election: Run %q: %w", e.name, ctx.Err())
			}
			if permanent(err) {
				return err
			}
			backoff()
			continue
		}
		stale, err := runTerm(ctx, e, t, fn)
		if err != nil {
			return err
		}
		if !stale {
			wait = first
			continue
		}
		// Storage refused the term's fence: the next term's may be refused
		// too (a store whose mark is ahead of the tokens), so campaign again
		// with the same backoff as after a failed campaign.
		backoff()
	}
}

// permanent reports whether a campaign's error would come back on every
// retry.
func permanent(err error) bool {
	return errors.Is(err, fence.ErrInvalid) || errors.Is(err, fence.ErrWrongType) || errors.Is(err, lock.ErrTokensExhausted) || errors.Is(err, ErrClosed)
}

// runTerm runs fn for term t and resigns it, and returns fn's error unless
// it only reports the term's end; stale says that storage refused the
// term's fence.
func runTerm(ctx context.Context, e *Election, t *Term, fn func(context.Context, fence.Fence) error) (stale bool, _ error) {
	tctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-t.Done():
			cancel(t.Err())
		case <-tctx.Done():
		}
	}()
	defer func() {
		cancel(context.Canceled)
		if t.Err() != nil {
			// The term ended by itself (lost): its release is already under
			// way, bounded, and the next campaign need not wait for it.
			return
		}
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), e.ttl)
		defer done()
		_ = t.Resign(rctx)
	}()
	err := fn(tctx, t.Fence())
	if err == nil {
		return false, nil
	}
	if errors.Is(err, ErrLost) || (t.Err() != nil && errors.Is(err, context.Canceled)) {
		return false, nil // the term's loss, not fn's failure: campaign again
	}
	if errors.Is(err, fence.ErrStale) {
		// Storage refused the term's fence: a newer term wrote there, so
		// this one is over whatever its lease says. Resign and campaign
		// again, as after a loss.
		return true, nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return false, fmt.Errorf("election: Run %q: %w", e.name, err)
	}
	return false, err
}
