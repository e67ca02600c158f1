// Package etcdlock is the lock of package lock on etcd: locks, fencing
// tokens and the election's leader record held by an etcd cluster, through
// go.etcd.io/etcd/client/v3.
//
// It is a nested module of its own, so a program that imports package lock
// or a storage guard pulls no etcd or gRPC module; only a program that
// imports etcdlock does.
//
// # Tokens
//
// A grant's token is [TokenBase] plus the create revision of the holder's
// key: a consensus value, issued in the grant's own response, that never
// goes back across leader changes and member restarts and that never
// depends on a clock. Holders of a resource follow one another in
// create-revision order, so the token increases with every grant. The base
// (2^52) puts etcd's tokens above the clock-anchored tokens of the Redis
// and PostgreSQL locks (microseconds since 1970, about 1.8e15 in 2026), so a
// resource moved from either of them to etcd keeps being admitted by its
// guards. Moving back, or to another etcd cluster, whose revisions may be
// lower, is refused by the guards (safe, not live) until the new lock's
// tokens pass the marks: see docs/guarantees.md.
//
// # Leases and waiting
//
// Each grant stands on an etcd lease that the server expires; extensions
// are keep-alives, and the holder believes the lease's TTL less a drift
// allowance (ttl/100 + 2ms), counted from before it asked, so it steps
// down before the server can expire it. Leases have whole seconds: a TTL is
// rounded up, so the server holds a lock at least as long as asked.
//
// Waiters queue in arrival order as keys under the resource's directory, as
// concurrency.Mutex's do: the key with the lowest create revision holds the
// lock, and a release or an expiry that deletes it makes the next one the
// holder in the same step. A process watches the directory and hears of the
// deletion; nothing polls. A waiter that vanished costs the others at most
// its lease.
//
// # The election
//
// election.New works on an etcd Locker as on any other: the leader record
// is a key beside the lock, written only by the grant that holds it, on
// that grant's lease (so it goes with the lock), and observers hear each
// term through an etcd watch.
//
// Owners' re-entrant holds (lock.Owner) and Advance are not supported on
// etcd, and are refused with an error matching fence.ErrInvalid.
package etcdlock
