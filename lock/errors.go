package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

var (
	// ErrNotAcquired means another holder has the lock. Errors that match it
	// are a [*NotAcquiredError], which says how long that lease has left.
	ErrNotAcquired = errors.New("lock: not acquired, another holder has it")

	// ErrNotHeld means the lease is no longer held: it expired, was released,
	// or Redis lost it. Another holder may have the lock; nothing was changed.
	ErrNotHeld = lockbackend.ErrNotHeld

	// ErrReleased is what [Lease.Err] matches, besides [ErrNotHeld], once
	// the lease was given up by [Lease.Release] rather than lost.
	ErrReleased = errors.New("lock: lease released")

	// ErrTokensExhausted means the next token would pass [fence.MaxToken]:
	// the token state was advanced to the top of the token space. No lock
	// was taken and nothing was changed; tokens are never repeated.
	ErrTokensExhausted = lockbackend.ErrTokensExhausted

	// ErrUnsupported means the Locker's backend does not offer what was
	// asked: [Owner] and [Locker.FenceLock] on Redlock, [Locker.Advance] or
	// an option that means nothing on a backend (a node timeout on one
	// Redis, a token retention on etcd), [RedisNames.FenceKey] on Redlock,
	// a Proclaim on a backend whose record keeps no proclaimed values.
	// Nothing was sent. It matches [errors.ErrUnsupported], and
	// [fence.ErrInvalid] as every refused argument does.
	ErrUnsupported = lockbackend.ErrUnsupported
)

// This package's own messages for the module-wide sentinels: callers match
// [fence.ErrInvalid] and [fence.ErrWrongType].
var (
	// errInvalid means an argument or option was rejected: an empty resource,
	// a lease under a millisecond (3ms under Redlock), a nil client, a prefix
	// with braces. Nothing was sent to Redis. It matches [fence.ErrInvalid]
	// too.
	errInvalid error = invalidError{}
)

// invalidError is errInvalid: its own sentinel, and fence's one word for an
// invalid argument.
type invalidError struct{}

func (invalidError) Error() string { return "lock: invalid argument" }

func (invalidError) Unwrap() error { return fence.ErrInvalid }

// NotAcquiredError is a refused acquisition. It matches [ErrNotAcquired].
type NotAcquiredError struct {
	// Resource is the resource that is held.
	Resource string
	// Remaining is the current holder's remaining lease as Redis reported it;
	// negative when the lock key carries no expiry (set outside this package).
	Remaining time.Duration
}

// Error names the resource and the remaining lease.
func (e *NotAcquiredError) Error() string {
	if e.Remaining < 0 {
		return fmt.Sprintf("lock: %q is held by another holder with no expiry", e.Resource)
	}
	return fmt.Sprintf("lock: %q is held by another holder for another %v", e.Resource, e.Remaining)
}

// Unwrap returns [ErrNotAcquired].
func (e *NotAcquiredError) Unwrap() error { return ErrNotAcquired }
