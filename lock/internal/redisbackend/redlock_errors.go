package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// A Redlock node that cannot be reached rarely says why within a node
// timeout: go-redis dials in the background and retries the dial with
// pauses, so the call ends with its context's error while the dial error
// ("connect: connection refused") only reaches the log. A dial watch keeps
// a node's latest failed dial, so that a call the node did not answer can
// report it.

// dialWatch holds a client's latest dial outcome: a failure, or nil once a
// dial succeeded.
type dialWatch struct {
	last atomic.Pointer[dialFailure]
}

type dialFailure struct {
	at  time.Time
	err error
}

// dialRecency is how old a failed dial may be and still explain a node's
// silence: go-redis dials again at least every few hundred milliseconds
// while calls wait for a connection, so an older failure is not this call's.
const dialRecency = 5 * time.Second

// failure returns the client's latest dial error if no dial has succeeded
// since and it is recent, or nil.
func (w *dialWatch) failure() error {
	if w == nil {
		return nil
	}
	f := w.last.Load()
	if f == nil || time.Since(f.at) > dialRecency {
		return nil
	}
	return f.err
}

// dialHook records every dial's outcome in its watch and changes nothing.
type dialHook struct{ w *dialWatch }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.w.last.Store(&dialFailure{at: time.Now(), err: err})
		} else {
			h.w.last.Store(nil)
		}
		return conn, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// dialWatches maps a weak pointer to a client to its watch, so that a
// client given to several Redlock Lockers gets one hook, not one per
// Locker, and a client that is gone leaves no entry behind.
var dialWatches sync.Map

// watchDials returns the dial watch of c, adding the hook the first time.
// Clients of other types are not watched (nil).
func watchDials(c redis.UniversalClient) *dialWatch {
	switch c := c.(type) {
	case *redis.Client:
		return watchOf(c)
	case *redis.ClusterClient:
		return watchOf(c)
	case *redis.Ring:
		return watchOf(c)
	}
	return nil
}

func watchOf[T any, P interface {
	*T
	AddHook(redis.Hook)
}](c P) *dialWatch {
	key := weak.Make((*T)(c))
	if w, ok := dialWatches.Load(key); ok {
		return w.(*dialWatch)
	}
	w := &dialWatch{}
	if got, loaded := dialWatches.LoadOrStore(key, w); loaded {
		return got.(*dialWatch)
	}
	c.AddHook(dialHook{w})
	runtime.AddCleanup((*T)(c), func(k weak.Pointer[T]) { dialWatches.Delete(k) }, key)
	return w
}

// unreachableError is a node call that got no reply, told by the node's
// own dial error. It still matches the error the call ended with (the
// node timeout, or the caller's context).
type unreachableError struct {
	dial  error
	ended error
}

func (e *unreachableError) Error() string { return e.dial.Error() }

func (e *unreachableError) Unwrap() []error { return []error{e.dial, e.ended} }

// explainSilence replaces err, a node call's lack of a reply, with the
// node's latest failed dial when there is one.
func explainSilence(err error, c Client) error {
	if !errors.Is(err, errNodeTimeout) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return err
	}
	if d := c.DialFailure(); d != nil {
		return &unreachableError{dial: d, ended: err}
	}
	return err
}

// nodeErrors is the failures of a Redlock call's nodes, each "node i: ...",
// on one line.
type nodeErrors []error

func (e nodeErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e nodeErrors) Unwrap() []error { return e }

// joinNodes is errors.Join for node failures: nil for none, one line for
// any number.
func joinNodes(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return nodeErrors(errs)
}

// quorumFailure returns a failed quorum as the call's error. The
// lock.QuorumError names the call and the resource itself, so it is not
// prefixed again; it is made to match ctx's error when ctx has ended, and
// a node's wrong-type key still comes back as [fence.ErrWrongType].
func quorumFailure(ctx context.Context, q *QuorumFailure) error {
	e := QuorumError(*q)
	var re redis.Error
	if errors.As(e, &re) {
		if t := translate(ctx, re, q.Op, q.Resource); errors.Is(t, errWrongType) || errors.Is(t, ErrTokensExhausted) {
			return t
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(e, ctxErr) {
		return fmt.Errorf("%w (%w)", e, ctxErr)
	}
	return e
}

// endedFailure is the error of a Redlock call whose context ended before
// a quorum answered: ctx's error, and what the nodes that failed said, so
// that a node that could not be reached is named with its own error rather
// than only with the deadline.
func endedFailure(ctx context.Context, op, resource string, errs []error) error {
	ctxErr := ctx.Err()
	var told []error
	for _, err := range errs {
		if !errors.Is(err, ctxErr) || errors.As(err, new(*unreachableError)) {
			told = append(told, err)
		}
	}
	if len(told) == 0 {
		return fmt.Errorf("lock: %s %q: %w", op, resource, ctxErr)
	}
	return fmt.Errorf("lock: %s %q: %w (%w)", op, resource, ctxErr, joinNodes(told))
}
