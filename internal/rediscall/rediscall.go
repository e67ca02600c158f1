// Package rediscall makes a call to Redis return by its context's deadline
// whatever the go-redis client's options.
//
// go-redis bounds a command's network reads and writes by its own
// ReadTimeout and WriteTimeout (5 s and 5 s by default in v9.23, -1 for
// none); only a client made with ContextTimeoutEnabled also ends them at the
// context's deadline, and no client ends them when a context is cancelled
// before its deadline. A server that accepted a command and went silent
// therefore holds the caller for the client's read timeout, or for ever.
//
// [Calls] sends a call straight to the client when the client ends it by
// the context's deadline itself, or the context has no deadline (see
// [Calls.Direct]): no goroutine, no allocation. Otherwise the call runs in a
// goroutine, and the caller
// returns when its context ends; the call goes on in the background until
// the client gives up on it (a client retries no command once the context
// has ended, so that is one read timeout at most, or at once when the
// client is closed), then hands its late result to a function of the
// caller's, which can undo what it did. [Calls.Wait] waits for those
// goroutines.
package rediscall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// HonoursDeadlines reports whether client ends each command's reads and
// writes by its context's deadline: a *redis.Client, *redis.ClusterClient
// or *redis.Ring (the clients redis.NewUniversalClient and the failover
// constructors return) made with ContextTimeoutEnabled. Any other client is
// taken not to.
func HonoursDeadlines(client any) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c != nil && c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c != nil && c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c != nil && c.Options().ContextTimeoutEnabled
	}
	return false
}

// CutError is the error of a call whose context ended before the client
// answered: the command may or may not have reached the server and run
// there, and may still do so. It matches the context's error.
type CutError struct {
	Err error // the context's error
}

// Error says the call was cut short, and why.
func (e *CutError) Error() string {
	return fmt.Sprintf("no reply from Redis before the context ended (the command may still run): %v", e.Err)
}

// Unwrap returns the context's error.
func (e *CutError) Unwrap() error { return e.Err }

// IsCut reports whether err is (or wraps) a [*CutError].
func IsCut(err error) bool {
	var c *CutError
	return errors.As(err, &c)
}

// Err returns ctx's error, or context.DeadlineExceeded once ctx's deadline
// has passed although its timer has not fired yet. A client made with
// ContextTimeoutEnabled ends a read at the deadline with a network timeout
// ("i/o timeout"), and on a loaded machine it can hand that back before the
// context's own timer has run: the call still ended by the deadline, and its
// error must say so.
func Err(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// Calls runs the calls to one client. Its zero value sends every call
// through a goroutine; make one with [New]. It is safe for concurrent use.
type Calls struct {
	honours bool

	mu   sync.Mutex
	n    int           // calls still running after their caller returned
	idle chan struct{} // closed when n drops to 0; nil while nobody waits
}

// New returns the Calls of client.
func New(client any) *Calls { return &Calls{honours: HonoursDeadlines(client)} }

// For returns the Calls of a client that ends each call by its context's
// deadline itself if honours is true.
func For(honours bool) *Calls { return &Calls{honours: honours} }

// Direct reports whether a call with ctx may go straight to the client: ctx
// has no deadline (there is none to keep), or it has one and the client ends
// its reads and writes by it. Only a deadline that the client would not keep
// sends a call through [Run].
//
// A context cancelled before its deadline, or without one, still holds a
// direct call until its reply, the deadline, or the client's read timeout:
// no go-redis client ends a command on cancellation, and the callers take
// that as the price of a call without a goroutine. A goroutine per call
// costs a thread woken on every call (it made an uncontended acquire and
// release 1.3 times redislock's in the performance report, against 1.07
// times direct), for an early return that no deadline asks for.
func (c *Calls) Direct(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	_, ok := ctx.Deadline()
	return !ok || c.honours
}

// Run returns call(ctx)'s result, by ctx's end: unless [Calls.Direct], call
// runs in a goroutine, and when ctx ends first Run returns the zero T and
// false while call goes on. Once it returns, its result is handed to late,
// if not nil, in that goroutine; late should bound its own work.
// [Calls.Wait] waits for the goroutine, late included.
func Run[T any](ctx context.Context, c *Calls, call func(context.Context) T, late func(T)) (T, bool) {
	if c.Direct(ctx) {
		return call(ctx), true
	}
	var (
		mu        sync.Mutex
		abandoned bool
		res       = make(chan T, 1)
	)
	c.add()
	go func() {
		defer c.done()
		v := call(ctx)
		mu.Lock()
		if !abandoned {
			res <- v
			mu.Unlock()
			return
		}
		mu.Unlock()
		if late != nil {
			late(v)
		}
	}()
	select {
	case v := <-res:
		return v, true
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case v := <-res: // the reply came as ctx ended: it counts
		return v, true
	default:
	}
	abandoned = true
	var zero T
	return zero, false
}

// Cmd runs call as [Run] does; a call cut short returns a command whose
// error is a [*CutError].
func Cmd(ctx context.Context, c *Calls, call func(context.Context) *redis.Cmd, late func(*redis.Cmd)) *redis.Cmd {
	cmd, ok := Run(ctx, c, call, late)
	if !ok {
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(&CutError{Err: ctx.Err()})
	}
	return cmd
}

func (c *Calls) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *Calls) done() {
	c.mu.Lock()
	if c.n--; c.n == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	c.mu.Unlock()
}

// Wait waits until no call started through [Run] is running, late work
// included, or until deadline; it reports whether none is. The calls still
// running then end when the client gives up on them (its read timeout), or
// at once when the client is closed.
func (c *Calls) Wait(deadline time.Time) bool {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return true
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	idle := c.idle
	c.mu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}
