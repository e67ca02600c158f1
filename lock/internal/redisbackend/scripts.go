package redisbackend

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each script is loaded once per process and run by EVALSHA, falling back to
// EVAL the first time a server has not seen it. The scripts that issue or
// raise tokens start with the shared token-state helpers; those that may hand
// the lock to a queued waiter (acquire, release) also with handover.lua. The
// release starts with its plain path, which needs none of them: Lua makes
// each helper anew on every run.
var (
	//go:embed tokenstate.lua
	tokenStateLua string

	//go:embed handover.lua
	handOverLua string

	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(tokenStateLua + handOverLua + acquireLua)

	//go:embed try_fast.lua
	tryFastLua string

	//go:embed try.lua
	tryLua    string
	trySrc    = tryFastLua + tokenStateLua + tryLua
	tryScript = redis.NewScript(trySrc)

	//go:embed release_plain.lua
	releasePlainLua string

	//go:embed release.lua
	releaseLua    string
	releaseSrc    = releasePlainLua + tokenStateLua + handOverLua + releaseLua
	releaseScript = redis.NewScript(releaseSrc)

	//go:embed extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)

	//go:embed ttl.lua
	ttlLua    string
	ttlScript = redis.NewScript(ttlLua)

	//go:embed advance.lua
	advanceLua    string
	advanceScript = redis.NewScript(tokenStateLua + advanceLua)

	//go:embed foreign.lua
	foreignLua    string
	foreignScript = redis.NewScript(tokenStateLua + foreignLua)
)

// The hashes of the scripts run by runScript, as interface values made
// once.
var (
	tryHash     any = tryScript.Hash()
	releaseHash any = releaseScript.Hash()
)

// runScript runs a script as [redis.Script.Run] does (EVALSHA, then EVAL
// with src if the server has not seen it) from args laid out as EVALSHA
// takes them: "evalsha", the hash, the number of keys, the keys, the
// arguments. The uncontended grant and release pass their keys as pointers
// into the Lease (go-redis writes a *string as the string, and routes by
// it on a cluster), which saves boxing each key into an interface on
// every call, as Run would.
func runScript(ctx context.Context, c redis.UniversalClient, src string, args []any) *redis.Cmd {
	cmd := c.Do(ctx, args...)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", src
		cmd = c.Do(ctx, args...)
	}
	return cmd
}
