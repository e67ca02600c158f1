// Package lock is a Redis lock whose every grant carries a fencing token.
//
// A [Locker] grants a lease on a named resource to one holder at a time. The
// grant and its token come from one Lua script, in one round trip: the script
// sets the lock key (SET PX, only if absent) and, only if that succeeded,
// increments the resource's token counter. The token therefore strictly
// increases with every grant of the resource, and a [Lease] hands it to
// storage as a [fence.Fence] together with a holder id that is unique to the
// grant.
//
// # Why tokens
//
// A lease protects nothing by itself once its holder pauses past the TTL (a
// GC pause, a slow network, a suspended VM): the holder still believes it holds
// the lock and its late write overwrites the next holder's work. Releasing by
// compare-and-delete only keeps it from deleting the next holder's lock. The
// storage adapters of this module (storage/postgres, storage/redis) close the
// gap: they admit a read or write only if its fence is not older than the
// newest one they have admitted. Present [Lease.Fence] with every read and
// write made under the lease.
//
// # Keys
//
// For resource r and prefix p (default [DefaultPrefix]) the lock lives in
// "p{r}:lock" and the counter in "p{r}:token". Both share the hash tag {r}, so
// they sit in one Redis Cluster slot and one script can touch both. The counter
// never expires and release never deletes it. The lock key's value is the
// holder id, so only the holder can release ([Lease.Release]) or extend
// ([Lease.Extend]) its lease.
//
// # When Redis loses data
//
// A restart without persistence, a failover to a lagging replica, eviction or
// FLUSHALL can reset a counter. Storage stays safe (it refuses the low tokens
// as stale), and the lock heals: [Locker.Advance] raises the counter past the
// high-water mark that the refusal reports (see [fence.HighWater]). For the
// strongest setting run Redis with appendonly yes and appendfsync always, and
// maxmemory-policy noeviction (or a volatile-* policy: counters carry no TTL).
//
// # Locks from other libraries
//
// [Locker.FenceLock] fences a lock that redsync, bsm/redislock or another
// library took, without replacing it: it issues a token for the grant only
// while the lock key still holds the grant's value, the same token for every
// call within one grant and a higher one for the next grant.
// [Locker.FenceLockAbove] heals such a lock after Redis lost its records,
// as [Locker.Advance] does for this package's own locks.
//
// # Errors
//
// [ErrNotAcquired] (as a [*NotAcquiredError] that says how long the current
// lease has left), [ErrNotHeld] when a lease was already lost, [ErrInvalid] for
// rejected arguments (nothing is sent), [ErrWrongType] when a key of another
// type is in the way (it is left as it was). Calls whose context ends return an
// error that matches ctx.Err() and leave no lock behind.
package lock
