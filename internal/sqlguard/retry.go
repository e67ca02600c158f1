package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Retry is the adapters' Retry: it calls fn until it succeeds, returns an
// error that a retry cannot cure, or has been called attempts times (zero
// means defaultAttempts). It retries errors that match the store's
// Retryable error or fence.ErrConflict, waiting a randomised delay that
// starts at 1 ms and doubles up to 100 ms; it never retries an error that
// matches fence.ErrOutcomeUnknown, since the work may have been applied.
// If ctx ends while waiting, the error matches ctx.Err() and wraps fn's last
// error.
func (s *Store) Retry(ctx context.Context, attempts, defaultAttempts int, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return s.Invalid("nil context")
	}
	if fn == nil {
		return s.Invalid("nil retry function")
	}
	if attempts < 0 {
		return s.Invalid("negative attempts %d", attempts)
	}
	if attempts == 0 {
		attempts = defaultAttempts
	}
	delay := time.Millisecond
	for i := 1; ; i++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: retry: %w", s.Name, err)
		}
		err := fn(ctx)
		if err == nil || i == attempts || !s.retryable(err) {
			return err
		}
		wait := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, 100*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &retryError{name: s.Name, ctxErr: ctx.Err(), last: err}
		case <-t.C:
		}
	}
}

func (s *Store) retryable(err error) bool {
	if errors.Is(err, fence.ErrOutcomeUnknown) {
		// The work may have been applied: running it again may apply it twice.
		return false
	}
	return errors.Is(err, s.Retryable) || errors.Is(err, fence.ErrConflict)
}

// retryError is Retry's error when ctx ends between attempts: it matches
// both ctx's error and the last attempt's, and names the store once (the
// last error usually starts with the store's name too).
type retryError struct {
	name         string
	ctxErr, last error
}

func (e *retryError) Error() string {
	return e.name + ": retry: " + e.ctxErr.Error() + " (last error: " + strings.TrimPrefix(e.last.Error(), e.name+": ") + ")"
}

func (e *retryError) Unwrap() []error { return []error{e.ctxErr, e.last} }
