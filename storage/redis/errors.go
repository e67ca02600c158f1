package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/fencekit/fencekit/internal/rediscmd"
)

var (
	// ErrResourceMismatch means a fence names another resource than the one
	// the key's high-water mark was set for. Tokens of different resources
	// come from different counters and cannot be compared, so nothing was
	// changed. Errors that match it are usually a [*ResourceError].
	ErrResourceMismatch = errors.New("storage/redis: key is fenced by another resource")
)

// This package's own messages for the module-wide sentinels: callers match
// [fence.ErrInvalid] and [fence.ErrWrongType].
var (
	// errWrongType means the Redis key of a value holds something this store
	// did not write: another type (a string, a list, ...) or a hash whose
	// fields or values are not exactly of the shape the store writes. The key
	// was left as it was.
	errWrongType error = &kindError{"storage/redis: key holds data of another kind", fence.ErrWrongType}

	// errInvalidKey means a value key was empty. Nothing was sent. It
	// matches [fence.ErrInvalid] too.
	errInvalidKey error = &kindError{"storage/redis: invalid key", fence.ErrInvalid}

	// errInvalidOption means an option passed to [New] or to a write, or an
	// argument of a call, was invalid: out of range, nil (a nil context, a
	// nil function), or a retry window shorter than the client's retry
	// horizon. The error names the problem. Nothing was sent. It matches
	// [fence.ErrInvalid] too.
	errInvalidOption error = &kindError{"storage/redis: invalid option", fence.ErrInvalid}
)

// kindError is a sentinel of this package that also matches the module-wide
// sentinel of its kind ([fence.ErrInvalid], [fence.ErrWrongType]), so that
// one errors.Is covers every package.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// ResourceError is a fence refused because the key's high-water mark belongs
// to another resource. It matches [ErrResourceMismatch].
type ResourceError struct {
	// Key is the value's key, without the store's prefix.
	Key string
	// Fence is the fence that was refused.
	Fence fence.Fence
	// Resource is the resource the key's mark was set for.
	Resource string
}

// Error names the key and both resources.
func (e *ResourceError) Error() string {
	return fmt.Sprintf("storage/redis: key %q is fenced by resource %q, not %q", e.Key, e.Resource, e.Fence.Resource)
}

// Unwrap returns [ErrResourceMismatch].
func (e *ResourceError) Unwrap() error { return ErrResourceMismatch }

// mayHaveRun reports whether a call that failed with err may have run its
// script on the server: unless go-redis never wrote its command, or wrote it
// once and got an error reply. Every script checks before it writes, and
// Redis lets a script that has written go on writing even past maxmemory,
// so an error reply means the script changed nothing. A client whose
// options could not be read may not write arguments through go-redis, so
// its sends cannot be counted.
func (s *Store) mayHaveRun(err error, sent *sendCount) bool {
	if rediscall.IsCut(err) {
		return true // the command may still be sent, after this count
	}
	if !s.countsSends {
		return true // a refused send may have followed one that ran
	}
	switch n := sent.sends(); {
	case n == 0:
		return !s.knownClient
	case n == 1:
		var answered goredis.Error
		return !errors.As(err, &answered)
	}
	return true
}

// errReadLost is the cause of a fenced read's unknown outcome: its reply
// was lost, its first run raised the mark, and the value changed before the
// client's retry, so what it read cannot be given.
var errReadLost = errors.New("the reply was lost and the value changed before the client's retry; the first run was admitted and raised the mark, read again")

// reply is one script's answer, decoded. Every script answers with an array
// whose first element is a status word; this is the only place that reads
// driver replies and errors.
type reply struct {
	status  string
	version int64
	data    []byte
	expires time.Time
	mark    fence.Fence
	kind    string // WRONGTYPE: the type found
	res     string // RESOURCE: the resource of the mark
}

// decode turns a script's result into a reply, or a driver or context error
// into an error naming the operation and the key. A failure after ctx ended
// matches ctx.Err(), whatever the driver made of it (a closed connection, a
// read timeout). sent counts the sends of a call that may change something
// (nil for a read): when such a call fails after its script may have run,
// the error is an [*fence.OutcomeUnknownError].
func (s *Store) decode(ctx context.Context, op, key string, cmd rediscmd.Reply, sent *sendCount) (reply, error) {
	vals, err := cmd.Slice()
	if err != nil {
		cause := err
		if ctxErr := rediscall.Err(ctx); ctxErr != nil && !errors.Is(err, ctxErr) {
			cause = fmt.Errorf("%w (%v)", ctxErr, err)
		}
		if sent != nil && s.mayHaveRun(err, sent) {
			return reply{}, &fence.OutcomeUnknownError{Op: fmt.Sprintf("storage/redis: %s %q", op, key), Err: cause}
		}
		return reply{}, fmt.Errorf("storage/redis: %s %q: %w", op, key, cause)
	}
	var r reply
	if len(vals) == 0 {
		return r, fmt.Errorf("storage/redis: %s %q: empty script reply", op, key)
	}
	r.status, _ = vals[0].(string)
	str := func(i int) string {
		if i < len(vals) {
			s, _ := vals[i].(string)
			return s
		}
		return ""
	}
	num := func(i int) int64 {
		if i < len(vals) {
			n, _ := vals[i].(int64)
			return n
		}
		return 0
	}
	switch r.status {
	case "OK", "NOTFOUND":
		r.version = num(1)
		if len(vals) > 2 {
			if s, ok := vals[2].(string); ok {
				r.data = []byte(s)
			}
		}
		if ms := num(3); ms > 0 {
			r.expires = time.UnixMilli(ms)
		}
		if len(vals) > 6 {
			tok, _ := strconv.ParseInt(str(5), 10, 64)
			r.mark = fence.Fence{Resource: str(4), Token: fence.Token(tok), Holder: str(6)}
		}
	case "STALE":
		tok, err := strconv.ParseInt(str(2), 10, 64)
		if err != nil {
			return r, fmt.Errorf("storage/redis: %s %q: bad token %q in the high-water mark", op, key, str(2))
		}
		r.mark = fence.Fence{Resource: str(1), Token: fence.Token(tok), Holder: str(3)}
	case "CONFLICT":
		r.version = num(1)
	case "WRONGTYPE":
		r.kind = str(1)
		return r, fmt.Errorf("%w: %s %q: the key holds a %s; it was left unchanged", errWrongType, op, key, r.kind)
	case "RESOURCE":
		r.res = str(1)
	case "LOST":
		r.version = num(1)
	default:
		return r, fmt.Errorf("storage/redis: %s %q: unexpected script reply %q", op, key, r.status)
	}
	return r, nil
}
