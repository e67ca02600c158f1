package election

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// What the election model (model_test.go) needs to build its broken
// variants: an election that sends set_leader.lua with a line changed, or
// steps down later than its margin says. Tests only.

// SetLeaderSource returns set_leader.lua as the election sends it.
func SetLeaderSource() string { return setLeaderLua }

// UseSetLeader makes e record its leaders with src instead of
// set_leader.lua, and returns the script's hash.
func UseSetLeader(e *Election, src string) string {
	e.setLeader = redis.NewScript(src)
	return e.setLeader.Hash()
}

// SetLeaderHash returns the hash of the script e records its leaders with.
func SetLeaderHash(e *Election) string { return e.setLeader.Hash() }

// SetStepDown sets e's step-down margin without the option's checks.
func SetStepDown(e *Election, d time.Duration) { e.margin = d }
