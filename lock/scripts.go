package lock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each script is loaded once per process and run by EVALSHA, falling back to
// EVAL the first time a server has not seen it. The scripts that issue or
// raise tokens (release does, when it hands the lock to a waiter) start with
// the shared token-state helpers.
var (
	//go:embed tokenstate.lua
	tokenStateLua string

	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(tokenStateLua + acquireLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(tokenStateLua + releaseLua)

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
