package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/fencekit/fencekit/internal/rediscmd"
)

// goRedis runs the store's scripts on a go-redis client. A *goredis.Client
// or *goredis.ClusterClient gets the call's arguments as they are laid out
// (Do); any other Scripter, a wrapper of the caller's own, gets EvalSha and
// Eval as goredis.Script.Run would call them, so that what it adds (tracing,
// faults) still sees every call.
type goRedis struct {
	c       goredis.Scripter
	do      func(ctx context.Context, args ...any) *goredis.Cmd // nil for a wrapper
	honours bool
}

var _ rediscmd.StoreClient = (*goRedis)(nil)

func newGoRedis(c goredis.Scripter) *goRedis {
	g := &goRedis{c: c, honours: rediscall.HonoursDeadlines(c)}
	switch c := c.(type) {
	case *goredis.Client:
		g.do = c.Do
	case *goredis.ClusterClient:
		g.do = c.Do
	}
	return g
}

func (g *goRedis) Run(ctx context.Context, src string, args []any) rediscmd.Reply {
	if g.do != nil {
		cmd := g.do(ctx, args...)
		if noScript(cmd) {
			args[0], args[1] = "eval", src
			cmd = g.do(ctx, args...)
		}
		return cmd
	}
	n, _ := args[2].(int)
	keys := make([]string, n)
	for i := range keys {
		keys[i], _ = args[3+i].(string)
	}
	hash, _ := args[1].(string)
	cmd := g.c.EvalSha(ctx, hash, keys, args[3+n:]...)
	if noScript(cmd) {
		cmd = g.c.Eval(ctx, src, keys, args[3+n:]...)
	}
	return cmd
}

// noScript reports whether the server had not seen the script.
func noScript(cmd *goredis.Cmd) bool {
	err := cmd.Err()
	return err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT")
}

func (g *goRedis) HonoursDeadlines() bool { return g.honours }

// Load loads src with SCRIPT LOAD (on every master of a ClusterClient).
func (g *goRedis) Load(ctx context.Context, src string) error {
	return g.c.ScriptLoad(ctx, src).Err()
}
