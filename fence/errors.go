package fence

import (
	"errors"
	"fmt"
)

var (
	// ErrStale means a store refused an operation because a newer holder has
	// been admitted for the resource. Errors that match it are usually a
	// [*StaleError] carrying the high-water mark. Nothing was changed.
	ErrStale = errors.New("fence: stale fence, a newer holder has been admitted")

	// ErrConflict means an optimistic write found a version other than the one
	// it read. Errors that match it are usually a [*ConflictError]. Nothing was
	// changed; read again and retry.
	ErrConflict = errors.New("fence: version conflict")

	// ErrNotFound means the row or value an operation targets does not exist.
	// It is distinct from ErrStale: nothing refused the caller's fence.
	ErrNotFound = errors.New("fence: not found")

	// ErrInvalidFence means a fence cannot be presented to storage: empty
	// resource, token below 1 or empty holder. Nothing was sent.
	ErrInvalidFence = errors.New("fence: invalid fence")
)

// StaleError is the refusal of a fence by a store. It matches [ErrStale].
type StaleError struct {
	// Fence is the fence that was refused.
	Fence Fence
	// HighWater is the store's mark that the fence lost to: the newest fence
	// admitted for the resource (or row). A lock that lost its counter can
	// advance it past HighWater.Token to make progress again.
	HighWater Fence
}

// Error describes both the refused fence and the mark it lost to.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale fence for %q: token %d (holder %s) lost to token %d (holder %s)",
		e.Fence.Resource, e.Fence.Token, e.Fence.Holder, e.HighWater.Token, e.HighWater.Holder)
}

// Unwrap returns [ErrStale], so errors.Is(err, ErrStale) holds.
func (e *StaleError) Unwrap() error { return ErrStale }

// ConflictError is an optimistic write that found another version than it
// expected. It matches [ErrConflict].
type ConflictError struct {
	// Key names what was written: a resource, a Redis key or a table row.
	Key string
	// Expected is the version the caller read.
	Expected int64
	// Actual is the version found, or -1 when the store could not tell
	// (for example, when the row is gone).
	Actual int64
}

// Error names the key and both versions.
func (e *ConflictError) Error() string {
	if e.Actual < 0 {
		return fmt.Sprintf("fence: version conflict on %q: expected version %d", e.Key, e.Expected)
	}
	return fmt.Sprintf("fence: version conflict on %q: expected version %d, found %d", e.Key, e.Expected, e.Actual)
}

// Unwrap returns [ErrConflict], so errors.Is(err, ErrConflict) holds.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// HighWater returns the high-water mark carried by err if err is or wraps a
// [*StaleError], and false otherwise.
func HighWater(err error) (Fence, bool) {
	var se *StaleError
	if errors.As(err, &se) {
		return se.HighWater, true
	}
	return Fence{}, false
}
