// Package redisbackend holds the locks of package lock in Redis: a single
// deployment (lock.New: a server, a Cluster, a Ring or a failover client)
// and Redlock (lock.NewRedlock, a quorum of independent masters). Each
// implements internal/lockbackend's contract: a grant and its
// clock-anchored token in one script, the wait queue and its hand-over in
// the release script, wake-ups over (sharded) pub/sub, and the record
// beside the lock that the election keeps its leader in. Package lock
// keeps everything portable (the Locker, the Lease, waiting, renewal,
// telemetry) and the public constructors, names and errors.
package redisbackend
