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

	// ErrInvalid means a call was given an argument it cannot use: an empty
	// name, a non-positive TTL, a nil client, an unsafe identifier. Nothing
	// was sent and nothing changed. Every package of this module returns
	// errors that match it for its own invalid arguments, each with a message
	// that names the problem.
	ErrInvalid = errors.New("fence: invalid argument")

	// ErrWrongType means a Redis key that a package of this module uses
	// holds data it did not write there: a key of another type, a hash
	// without its fields, a token state out of range. The key was left as
	// it was. The lock and the Redis store return errors that match it,
	// each naming the key.
	ErrWrongType = errors.New("fence: key holds data of another kind")

	// ErrOutcomeUnknown means a write may or may not have been applied: the
	// call's context ended, or its connection broke, after the request was
	// sent and before its reply arrived (while COMMIT or a script was in
	// flight). The library cannot tell which, and never reports such a call
	// as not applied. Errors that match it also match their cause (ctx.Err(),
	// the network error), usually through an [*OutcomeUnknownError].
	//
	// What to do next: read the state under a fence and decide, or run the
	// work through an exactly-once record (the SQL guards' Once), which makes
	// a retry tell the truth. Retrying the same write blindly may apply it
	// twice: the fence that was admitted once is admitted again.
	ErrOutcomeUnknown = errors.New("fence: outcome unknown, the write may or may not have been applied")
)

// kindError is a sentinel that also matches a broader sentinel.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// OutcomeUnknownError is a write whose outcome the store cannot tell. It
// matches [ErrOutcomeUnknown] and its cause.
type OutcomeUnknownError struct {
	// Op names the call, for example "postgres: InTx commit".
	Op string
	// Err is the cause: ctx.Err(), a network error, a driver error.
	Err error
}

// Error names the call and the cause, and says that the write may have been
// applied.
func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%s: outcome unknown, the write may or may not have been applied: %v", e.Op, e.Err)
}

// Unwrap returns [ErrOutcomeUnknown] and the cause, so errors.Is matches
// both.
func (e *OutcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Err} }

// StaleError is the refusal of a fence by a store. It matches [ErrStale].
type StaleError struct {
	// Fence is the fence that was refused.
	Fence Fence
	// HighWater is the store's mark that the fence lost to: the newest fence
	// admitted for the resource (or row). A lock that lost its counter can
	// advance it past HighWater.Token to make progress again.
	HighWater Fence
}

// Error describes both the refused fence and the mark it lost to by their
// tokens. Holder ids are secrets (a lock's holder id is what releases it), so
// the text names each holder only by [HolderMark].
func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale fence for %q: token %d (holder %s) lost to token %d (holder %s)",
		e.Fence.Resource, e.Fence.Token, HolderMark(e.Fence.Holder), e.HighWater.Token, HolderMark(e.HighWater.Holder))
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

// LostTo returns the fence that a refused fence lost to, the store's
// high-water mark, if err is or wraps a [*StaleError], and false otherwise.
// A lock whose token state was lost can advance its tokens past it.
func LostTo(err error) (Fence, bool) {
	var se *StaleError
	if errors.As(err, &se) {
		return se.HighWater, true
	}
	return Fence{}, false
}

// errInvalidFence is the kind of [Fence.Validate]'s errors: they match
// [ErrInvalid], and their message says that the fence is what was refused.
var errInvalidFence error = &kindError{msg: "fence: invalid fence", kind: ErrInvalid}
