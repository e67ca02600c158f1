package lock_test

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

// fenceKey is keysOf(l).FenceKey(lockKey), on a Locker that has one.
func fenceKey(l *lock.Locker, lockKey string) string {
	k, err := keysOf(l).FenceKey(lockKey)
	if err != nil {
		panic(err)
	}
	return k
}
