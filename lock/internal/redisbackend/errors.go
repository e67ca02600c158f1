package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

// The errors of the Redis backend: the contract's, under the names package
// lock exports them by, and this package's messages for fence's sentinels.
var (
	ErrNotHeld         = lockbackend.ErrNotHeld
	ErrTokensExhausted = lockbackend.ErrTokensExhausted
	ErrUnsupported     = lockbackend.ErrUnsupported

	// errInvalid means an argument or option was rejected; nothing was
	// sent. It matches fence.ErrInvalid.
	errInvalid error = invalidError{}

	// errWrongType means a lock key or token state already holds a value of
	// another type, or a token out of range. The key was left as it was.
	errWrongType error = wrongTypeError{}
)

// cleanupTimeout bounds a cleanup that outlives the call that needed it
// (lock's cleanupTimeout).
const cleanupTimeout = 2 * time.Second

type invalidError struct{}

func (invalidError) Error() string { return "lock: invalid argument" }

func (invalidError) Unwrap() error { return fence.ErrInvalid }

// wrongTypeError is errWrongType: this package's message for a key of
// another type, matching the module-wide [fence.ErrWrongType].
type wrongTypeError struct{}

func (wrongTypeError) Error() string { return "lock: key holds the wrong type" }

func (wrongTypeError) Unwrap() error { return fence.ErrWrongType }

// tokensExhaustedReply is the text of the error reply tokenstate.lua gives
// when the next token would pass fence.MaxToken.
const tokensExhaustedReply = "token space exhausted"

// translate turns a Redis reply error into this package's errors; it is the
// one place that inspects driver errors. op and resource label the error.
func translate(ctx context.Context, err error, op, resource string) error {
	if err == nil {
		return nil
	}
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE") {
		return fmt.Errorf("%w: %s %q: %s", errWrongType, op, resource, re.Error())
	}
	if errors.As(err, &re) && strings.Contains(re.Error(), tokensExhaustedReply) {
		return fmt.Errorf("%w: %s %q", ErrTokensExhausted, op, resource)
	}
	if ctxErr := rediscall.Err(ctx); ctxErr != nil && !errors.Is(err, ctxErr) {
		// Make errors.Is(err, ctx.Err()) hold even when the driver reported
		// the cancellation as a network error, also when it ended a read at
		// the deadline before the context's timer ran (see rediscall.Err).
		return fmt.Errorf("lock: %s %q: %w (%w)", op, resource, ctxErr, err)
	}
	return fmt.Errorf("lock: %s %q: %w", op, resource, err)
}

// isReply reports whether err is an error reply from Redis: the command
// reached the server and was refused there, so it had no effect.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.ErrClosed)
}
