package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/fencekit/fencekit/internal/rediscmd"
)

// run runs sc on the store's client with keys and args, and returns by
// ctx's deadline whatever the client's options. A client that ends its
// reads by the deadline itself (rueidis, or go-redis made with
// ContextTimeoutEnabled) gets the call directly, as does a ctx without a
// deadline (see rediscall.Calls.Direct); any other one would hold the
// caller for its read timeout (5 s by default) when the server went
// silent, so the call runs in a goroutine and the caller returns when ctx
// ends, with a *rediscall.CutError: the script may still run (mayHaveRun
// says so), and the call ends in the background when the client gives up
// on it.
//
// The arguments are laid out once, here, so that keys and args stay on
// the caller's stack: only the laid-out slice, which the client keeps
// while it writes the command, is allocated.
func (s *Store) run(ctx context.Context, sc *rediscmd.Script, keys []string, args ...any) rediscmd.Reply {
	all := sc.Args(keys, args...)
	if s.calls.Direct(ctx) {
		return s.client.Run(ctx, sc.Src(), all)
	}
	r, ok := rediscall.Run(ctx, s.calls, func(ctx context.Context) rediscmd.Reply { return s.client.Run(ctx, sc.Src(), all) }, nil)
	if !ok {
		return cutReply(ctx)
	}
	return r
}

// cutReply is the reply of a call cut short at ctx's end.
func cutReply(ctx context.Context) rediscmd.Reply {
	cmd := goredis.NewCmd(ctx)
	cmd.SetErr(&rediscall.CutError{Err: ctx.Err()})
	return cmd
}

// loadScript loads sc into the server, by ctx's deadline (see run).
func (s *Store) loadScript(ctx context.Context, sc *rediscmd.Script) error {
	err, ok := rediscall.Run(ctx, s.calls, func(ctx context.Context) error { return s.client.Load(ctx, sc.Src()) }, nil)
	if !ok {
		return &rediscall.CutError{Err: ctx.Err()}
	}
	return err
}
