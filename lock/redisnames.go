package lock

import "fmt"

// RedisNames names what a Locker made by [New] or [NewRedlock] keeps in
// Redis: the keys of a resource's lock, its token state and its release
// channel, and the Redlock quorum. Only those Lockers have one: get it with
// [Locker.As], which answers false on every other backend (PostgreSQL,
// etcd), where these names would mean nothing.
//
// The names are for operators (ACL rules, keyspace inspection, Cluster
// slot placement) and for tests; the lock's keys are written by its
// scripts only.
type RedisNames struct {
	n      redisNames
	ff     foreignFencer // nil when the Locker does not fence foreign locks
	quorum int
}

// As sets target to the backend-specific view of l that it points to, and
// reports whether l has one: a *[RedisNames] on a Locker made by [New] or
// [NewRedlock]. On any other target, or another backend, it returns false
// and leaves target unchanged. (The door of Go CDK's As: the Locker's own
// methods mean the same on every backend.)
func (l *Locker) As(target any) bool {
	switch t := target.(type) {
	case *RedisNames:
		if l.names == nil {
			return false
		}
		ff, _ := l.b.(foreignFencer)
		*t = RedisNames{n: l.names, ff: ff, quorum: l.info.Quorum}
		return true
	}
	return false
}

// LockKey returns the Redis key that holds resource's lock: the prefix, the
// resource as a hash tag, and ":lock" (on Redlock, on every node).
func (n RedisNames) LockKey(resource string) string { return n.n.LockKey(resource) }

// TokenKey returns the Redis key of resource's token state: the newest token
// issued and the current grant's token and holder. It shares the lock key's
// slot, release keeps it, and it expires the token retention (see
// [WithTokenRetention]) after the last lease ends.
func (n RedisNames) TokenKey(resource string) string { return n.n.TokenKey(resource) }

// ReleaseChannel returns the pub/sub channel on which the waiters of
// resource's lock hear of a release, in the same script that deletes the
// lock or hands it on: the prefix, the resource as a hash tag, and
// ":released". On a *redis.ClusterClient it is a sharded channel
// (SPUBLISH), in the slot of the resource's keys.
//
// A release publishes only when waiters are queued in [Locker.Acquire]:
// the grant to the first live one, or an empty message when none of them
// is live any more. A release with nobody queued publishes nothing, since
// no waiter needs the message (a lock made by [NewRedlock] publishes every
// release).
func (n RedisNames) ReleaseChannel(resource string) string { return n.n.Channel(resource) }

// FenceKey returns the Redis key where [Locker.FenceLock] keeps lockKey's
// newest token and the value of its current grant: the Locker's prefix, a
// hash tag and lockKey. It expires the token retention after the lock's
// lease as of the last FenceLock call. It sits in lockKey's Redis
// Cluster slot whatever braces lockKey contains, so the one script that reads
// both is legal on a cluster, and distinct lock keys get distinct records.
//
// A Locker made by [NewRedlock] does not fence foreign locks: there it
// returns an error matching [ErrUnsupported].
func (n RedisNames) FenceKey(lockKey string) (string, error) {
	if n.ff == nil {
		return "", fmt.Errorf("%w: FenceKey: a Redlock Locker does not fence foreign locks", ErrUnsupported)
	}
	return n.ff.FenceKey(lockKey), nil
}

// Quorum returns how many nodes must agree for a lease to be held: 1 for a
// Locker made by [New], len(clients)/2+1 for one made by [NewRedlock].
func (n RedisNames) Quorum() int { return n.quorum }
