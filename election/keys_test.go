package election_test

import (
	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/lock"
)

// keysOf returns the Redis names of l, which the tests make with New or
// NewRedlock.
func keysOf(l *lock.Locker) lock.RedisNames {
	var n lock.RedisNames
	if !l.As(&n) {
		panic("keysOf: not a Redis Locker")
	}
	return n
}

// electionKeys returns the Redis names of e, which the tests make on a
// Locker from lock.New or lock.NewRedlock.
func electionKeys(e *election.Election) election.RedisNames {
	var n election.RedisNames
	if !e.As(&n) {
		panic("electionKeys: not an election on Redis")
	}
	return n
}
