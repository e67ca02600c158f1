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
// # Restores from a backup: --bump-revision
//
// A restore of the cluster from a snapshot takes its revision back, and
// with it the tokens: a grant made after the backup and one made by the
// restored cluster can get the same token, or the later a lower one, and
// the guards would then admit the older holder's late writes. Every
// restore of a cluster this package locks on must therefore run
// etcdutl snapshot restore with --bump-revision, by more than the
// revisions the cluster can have issued since the backup (1000000000 is
// ample), and --mark-compacted: then every token of the restored cluster
// is above every earlier one. A Locker that sees the cluster's revision
// or raft term go back (a restore without the bump) ends every lease it
// held and refuses to grant at or below the highest revision it saw, with
// an error matching [ErrRevisionWentBack]; a process started after the
// restore cannot tell, which is why the bump is the operator's step. A
// grant that a bumped restore lost (made after the backup) is found
// missing at the next keep-alive: Extend and TTL answer lock.ErrNotHeld
// from then on.
//
// # Leases and waiting
//
// A Locker keeps one etcd lease per lease length (whole seconds: a TTL is
// rounded up, so the server holds a lock at least as long as asked), as
// concurrency.Session does for concurrency.Mutex: granted at the first
// try, kept alive five times per TTL while keys stand on it, revoked once
// it has been idle for its TTL. A grant is one transaction that puts the
// holder's key on that lease and returns the token; a release is one
// deletion of the key, as concurrency.Mutex's Unlock is (with no compare:
// the key's name is the Locker's alone until the release's reply). The key layout, for a resource r under
// the Locker's prefix p:
//
//   - "p{r}/h/" followed by a slot name (the Locker's random id, a dot and
//     a number): a holder's or a queued waiter's key, on its lease, whose
//     value is the holder id; the one with the lowest create revision
//     holds. A Locker puts the same slots again for later acquisitions of
//     r, so that etcd's index of the directory, which each grant reads,
//     does not grow with every grant until the cluster compacts.
//   - "p{r}/r": the record beside the lock (the election's leader).
//
// The shared lease outlives any one lock, so what a lease was promised is
// kept by two rules:
//
//   - A holder believes no more than the server guarantees: the lease's
//     TTL from when the last keep-alive the server acknowledged was sent,
//     capped at the TTL asked for, less a drift allowance (ttl/100 + 2ms)
//     for clocks that run at different rates. Its Done closes then, before
//     the server can expire the lease. A grant on a lease whose
//     keep-alives are healthy believes at least 4/5 of its TTL, less a
//     keep-alive's round trip; Extend keeps the lease alive at once and
//     counts from that.
//   - Each key has an end of its own: the TTL asked for, from the try that
//     granted it or from the last Extend. A key neither extended nor
//     released is deleted by the Locker at its end, so a lease ends by its
//     TTL even while other keys keep the etcd lease alive; a deletion that
//     fails is tried again at each keep-alive, and a key whose deletion
//     never succeeded goes with the lease, which is revoked once it
//     carries no live key. Every belief ends no later than the key's end,
//     and an end once passed is final: Extend and TTL answer
//     lock.ErrNotHeld from then on, though a read would still find the key
//     until the deletion lands, and that deletion removes the key only as
//     the put it judged left it, so a queued waiter that put its key again
//     meanwhile keeps it.
//
// A lease revoked from outside (which ends every lock of the Locker on
// it) is found gone at the next keep-alive, within a fifth of its TTL and
// a round trip, and every Lease on it ends then, renewed or not: its Done
// closes, Validity is 0, Extend and TTL answer lock.ErrNotHeld. Renewals and reads give up on a member that
// does not answer within a fifth of the TTL (at least 500 ms) and go to
// the next, so a member cut off from its peers that its client still
// reaches costs a renewal one such attempt, not the lease.
//
// A paused or dead process sends no keep-alive, so the etcd leader expires
// the lease, and every key on it, within its TTL of the last one. A
// process cut off from the cluster (its member lost its quorum, or its
// connection) hears no acknowledgement: its holders step down when what
// the last one guaranteed runs out, and the majority hands the lock on
// when the lease expires there. etcd answers a keep-alive only on a leader
// that still has its quorum, and a new leader renews every lease, so no
// acknowledgement promises what the cluster does not keep. A member
// restart loses nothing (leases and keys are in the cluster's log).
//
// Waiters queue in arrival order as keys under the resource's directory, as
// concurrency.Mutex's do: the key with the lowest create revision holds the
// lock, and a release or an expiry that deletes it makes the next one the
// holder in the same step. A process watches the directory and hears of the
// deletion; nothing polls. A queued waiter's key ends QueueLife (3 s) or
// its TTL, whichever is longer, after its last refresh, so a waiter that
// vanished costs the others at most that, or its process's lease.
//
// A try whose reply was lost may have put its key, or may still put it: a
// request its client gave up on can be applied by the cluster later, after
// a deletion sent since. The Locker deletes the key at once, within the
// call's context while it lasts and then in the background, and looks for
// it at each keep-alive for 15 s more (twice etcd's request timeout with
// default timings), deleting it if it stands, so no lock is left that
// nobody knows of on a lease the Locker keeps alive for its other keys;
// past that, each keep-alive of the lease still looks for it, in one read
// with every such key of the lease, for as long as the lease lives.
// That key's slot is never put again by the Locker, and every deletion it
// sends is conditional on the key's value (the holder id), so nothing that
// lands late can take or delete a later acquisition's key.
//
// # The election
//
// election.New works on an etcd Locker as on any other: the leader record
// is a key beside the lock, written only by the grant that holds it, on
// that grant's lease and deleted with its key (so it goes with the lock),
// and observers hear each term through an etcd watch.
//
// Owners' re-entrant holds (lock.Owner) and Advance are not supported on
// etcd, and are refused with an error matching fence.ErrInvalid.
package etcdlock
