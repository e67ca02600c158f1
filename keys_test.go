package fencekit_test

import (
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
