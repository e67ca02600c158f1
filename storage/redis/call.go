package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rediscall"
)

// run runs sc on the store's client as sc.Run does, and returns by ctx's
// deadline whatever the client's options. A client made with
// ContextTimeoutEnabled ends its reads by the deadline itself and gets the
// call directly, as does a ctx without a deadline (see
// rediscall.Calls.Direct); any other one would hold the caller for its read timeout
// (5 s by default) when the server went silent, so the call runs in a
// goroutine and the caller returns when ctx ends, with a
// *rediscall.CutError: the script may still run (mayHaveRun says so), and
// the call ends in the background when the client gives up on it.
func (s *Store) run(ctx context.Context, sc *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	if s.calls.Direct(ctx) {
		return sc.Run(ctx, s.client, keys, args...)
	}
	return rediscall.Cmd(ctx, s.calls, func(ctx context.Context) *goredis.Cmd { return sc.Run(ctx, s.client, keys, args...) }, nil)
}

// loadScript loads sc into the server as sc.Load does, by ctx's deadline (see run).
func (s *Store) loadScript(ctx context.Context, sc *goredis.Script) error {
	cmd, ok := rediscall.Run(ctx, s.calls, func(ctx context.Context) *goredis.StringCmd { return sc.Load(ctx, s.client) }, nil)
	if !ok {
		return &rediscall.CutError{Err: ctx.Err()}
	}
	return cmd.Err()
}
