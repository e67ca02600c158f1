package lock

// keysOf returns the Redis names of l, which the tests make with New or
// NewRedlock.
func keysOf(l *Locker) RedisNames {
	var n RedisNames
	if !l.As(&n) {
		panic("keysOf: not a Redis Locker")
	}
	return n
}
