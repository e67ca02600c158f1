package lock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each script is loaded once per process and run by EVALSHA, falling back to
// EVAL the first time a server has not seen it. The scripts that issue or
// raise tokens start with the shared token-state helpers; those that may hand
// the lock to a queued waiter (acquire, release) also with handover.lua.
var (
	//go:embed tokenstate.lua
	tokenStateLua string

	//go:embed handover.lua
	handOverLua string

	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(tokenStateLua + handOverLua + acquireLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(tokenStateLua + handOverLua + releaseLua)

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
