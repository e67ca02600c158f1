package election

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed set_leader.lua
	setLeaderLua string
	//go:embed refresh_leader.lua
	refreshLeaderLua string
	//go:embed leader.lua
	leaderLua string
	//go:embed proclaim.lua
	proclaimLua string

	setLeaderScript     = redis.NewScript(setLeaderLua)
	refreshLeaderScript = redis.NewScript(refreshLeaderLua)
	leaderScript        = redis.NewScript(leaderLua)
	proclaimScript      = redis.NewScript(proclaimLua)
)
