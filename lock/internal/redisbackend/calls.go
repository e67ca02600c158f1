package redisbackend

import (
	"context"

	"github.com/fencekit/fencekit/internal/rediscall"
)

// Every call to Redis returns by its context's deadline, whatever the
// client's options. A client that ends its reads by the deadline itself
// (Client.HonoursDeadlines: rueidis, or go-redis made with
// ContextTimeoutEnabled) gets the call directly, as does a call whose
// context has no deadline (see rediscall.Calls.Direct); any other one would
// hold the caller for its read timeout (5 s by default) when the server went
// silent, so the call runs in a goroutine and the caller returns when its
// context ends (see package rediscall). A call cut short may still reach
// Redis; what it may have taken is released once it has returned (see
// lateCleanup), and Close waits for those calls within its bound.

// script runs sc on the Locker's client as sc.Run does, returning by ctx's
// end; a call cut short has a *rediscall.CutError, and late, if not nil,
// gets its result once it returns.
func (b *redisBackend) script(ctx context.Context, late func(Reply), sc *script, keys []string, args ...any) Reply {
	return callScript(ctx, b.calls, b.client, late, sc, keys, args...)
}

// callScript is script on any client and its Calls.
func callScript(ctx context.Context, calls *rediscall.Calls, c Client, late func(Reply), sc *script, keys []string, args ...any) Reply {
	if calls.Direct(ctx) {
		return sc.Run(ctx, c, keys, args...)
	}
	return cutCall(ctx, calls, func(ctx context.Context) Reply { return sc.Run(ctx, c, keys, args...) }, late)
}

// cutCall runs call as rediscall.Run does; a call cut short returns a
// reply whose error is a *rediscall.CutError.
func cutCall(ctx context.Context, calls *rediscall.Calls, call func(context.Context) Reply, late func(Reply)) Reply {
	r, ok := rediscall.Run(ctx, calls, call, late)
	if !ok {
		return cutReply{err: &rediscall.CutError{Err: ctx.Err()}}
	}
	return r
}

// lateCleanup returns what a call of an acquisition that was cut short
// does once it has returned: unless Redis refused it (then it changed
// nothing), it releases whatever the acquisition may have taken, as
// cleanup does, bounded by cleanupTimeout. It runs after the call, so the
// release cannot reach Redis before the grant it undoes.
func (b *redisBackend) lateCleanup(ctx context.Context, resource, holder, acq string) func(Reply) {
	values := context.WithoutCancel(ctx)
	return func(cmd Reply) {
		if err := cmd.Err(); err != nil && isReply(err) {
			return
		}
		ctx, cancel := context.WithTimeout(values, cleanupTimeout)
		defer cancel()
		_ = b.Abandon(ctx, resource, holder, acq)
	}
}
