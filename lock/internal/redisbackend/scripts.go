package redisbackend

import (
	"context"
	_ "embed"
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
	acquireScript = newScript(tokenStateLua + handOverLua + acquireLua)

	//go:embed try_fast.lua
	tryFastLua string

	//go:embed try.lua
	tryLua    string
	trySrc    = tryFastLua + tokenStateLua + tryLua
	tryScript = newScript(trySrc)

	//go:embed release_plain.lua
	releasePlainLua string

	//go:embed release.lua
	releaseLua    string
	releaseSrc    = releasePlainLua + tokenStateLua + handOverLua + releaseLua
	releaseScript = newScript(releaseSrc)

	//go:embed extend.lua
	extendLua    string
	extendScript = newScript(extendLua)

	//go:embed ttl.lua
	ttlLua    string
	ttlScript = newScript(ttlLua)

	//go:embed advance.lua
	advanceLua    string
	advanceScript = newScript(tokenStateLua + advanceLua)

	//go:embed foreign.lua
	foreignLua    string
	foreignScript = newScript(tokenStateLua + foreignLua)
)

// The hashes of the scripts run by runScript, as interface values made
// once.
var (
	tryHash     any = tryScript.Hash()
	releaseHash any = releaseScript.Hash()
)

// runScript runs a script from args laid out as EVALSHA takes them (see
// Client.Run). The uncontended grant and release pass their keys as
// pointers into the Lease (a client writes a *string as the string, and
// routes by it on a cluster), which saves boxing each key into an
// interface on every call, as script.Run would.
func runScript(ctx context.Context, c Client, src string, args []any) Reply {
	return c.Run(ctx, src, args)
}
