package election

// electionKeys returns the Redis names of e, which the tests make on a
// Locker from lock.New or lock.NewRedlock.
func electionKeys(e *Election) RedisNames {
	var n RedisNames
	if !e.As(&n) {
		panic("electionKeys: not an election on Redis")
	}
	return n
}
