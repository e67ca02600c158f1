// Package rueidisfence is the lock of package lock on a rueidis client
// (github.com/redis/rueidis): the Redis lock of lock.New and the Redlock
// of lock.NewRedlock, for programs that talk to Redis through rueidis
// rather than go-redis; and the fenced store of package storage/redis
// (NewStore), which keeps the values those locks guard.
//
// It is a nested module of its own, so a program that uses fencekit with
// go-redis pulls no rueidis module; only a program that imports
// rueidisfence does.
//
// The Locker it returns is the same *lock.Locker, on the same Redis
// backend as go-redis's: one set of scripts, keys and messages, reached
// through a small command interface that each client implements. So the
// tokens, the wait queue and its hand-over in the release, renewal,
// lock.Owner holds, Locker.FenceLock and the record the election keeps
// its leader in (package election works on it) are those of lock.New, and
// a resource may be locked by go-redis and rueidis Lockers together. On a
// Redis Cluster client, waiters subscribe with SSUBSCRIBE on a dedicated
// connection per slot, as on go-redis.
//
// The lock reads no key through rueidis's client-side cache. A client
// with the cache on (rueidis's default: CLIENT TRACKING) makes Redis
// remember every key the lock's scripts read for that client (in bench/'s
// runs the same scripts took Redis a quarter to two thirds more time per
// acquire and release through such a client than through go-redis); a
// client made for the lock alone can set rueidis.ClientOption.DisableCache.
//
// # The fenced store
//
// NewStore returns storage/redis's *Store on a rueidis client: the same
// Lua scripts, keys, high-water marks, versions and retry records as
// storage/redis's New on go-redis, so both clients may share a store's
// keys, on a single server or a Redis Cluster (a hash tag in a key decides
// its slot). What differs is what rueidis does after a lost reply: it does
// not send a script again after a network error, so the write reports an
// error matching fence.ErrOutcomeUnknown where go-redis would have retried
// it and reported its first run; and since the store cannot read a
// rueidis client's options, it looks for a call's retry record at every
// run and keeps records for storage/redis's DefaultRetryWindow unless
// WithRetryWindow says otherwise. NewStore's documentation has the
// details.
//
// # Moving from rueidislock
//
// rueidis's own lock package, rueidislock, gives a context that is
// cancelled when the lock is lost; it issues no fencing token, so a
// holder that pauses past its lease can still write over a newer holder's
// work. Both packages can be imported by one program (the names differ),
// so a migration can go resource by resource; a resource must be locked
// through one of them at a time, since their keys differ. The calls
// correspond:
//
//   - rueidislock.NewLocker(opts) with a rueidis.ClientOption: make the
//     rueidis.Client yourself and pass it to New (KeyMajority > 1 is a
//     quorum of independent servers: NewRedlock, one client each).
//   - locker.WithContext(ctx, name): Locker.Acquire(ctx, name, ttl), which
//     queues in arrival order and returns a *lock.Lease; lease.AutoRenew
//     keeps it and its Done channel closes when it is lost, as the
//     cancelled context did; lease.Release(ctx) for the cancel function.
//   - locker.TryWithContext: Locker.TryAcquire.
//   - what rueidislock cannot do: pass lease.Fence() (the token) to a
//     storage guard of this module, which refuses a write made with an
//     older token.
package rueidisfence
