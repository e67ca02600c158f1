// Package lock is a distributed lock whose every grant carries a fencing
// token, held on Redis (a server, a Cluster, or Redlock's independent
// masters), on PostgreSQL (package lock/pglock) or on etcd (the module
// lock/etcdlock).
//
// A [Locker] grants a lease on a named resource to one holder at a time. The
// grant and its token come in one round trip (on Redis, from one Lua script):
// the token strictly increases with every grant of the resource, and a
// [Lease] hands it to storage as a [fence.Fence] together with a holder id
// unique to the grant. Present [Lease.Fence] with every read and write made
// under the lease: a holder that pauses past its TTL (a GC pause, a slow
// network, a suspended VM) still believes it holds the lock, and only the
// storage adapters of this module (storage/postgres, storage/mysql,
// storage/redis), which admit a fence only if it is not older than the newest
// they have seen, keep its late write from overwriting the next holder's
// work.
//
// # Ways to use it
//
//   - [Locker.Do] acquires, runs a func(ctx context.Context, f fence.Fence)
//     error with the lease's fence, renews the lease while it runs, cancels
//     its ctx as soon as the lease is lost, and releases.
//   - [Locker.Acquire] waits for the lock (in arrival order, across
//     processes, woken by the release rather than by polling, on every
//     backend but Redlock, whose waiters poll);
//     [Locker.TryAcquire] does not wait. Release with [Lease.Release];
//     [Lease.Extend] or [AutoRenew] keep a lease longer (an extension
//     never shortens a lock), and [Lease.Done] and [Lease.Err] say when
//     and why it ended.
//   - [Owner] makes acquisitions re-entrant for a named owner: the same
//     fence and one more hold, the lock freed with the last hold.
//   - [NewRedlock] holds each lease on a quorum of independent masters,
//     with the same [Locker] and [Lease] API. Its token is the largest of
//     the granting nodes' tokens and is not a consensus value; storage
//     admission is what keeps two holders' writes apart.
//   - [Locker.FenceLock] fences a lock that redsync, bsm/redislock or
//     another library took, without replacing it.
//   - Package lock/pglock makes the same [Locker] on PostgreSQL alone, and
//     the module lock/etcdlock on etcd. A Locker holds its locks on a
//     backend (Redis, Redlock, PostgreSQL, etcd); leases, renewal, waiting,
//     [Locker.Do] and telemetry are the same on each. What a backend does
//     not offer ([Owner] and [Locker.FenceLock] on Redlock, for instance)
//     is refused with an error matching [fence.ErrInvalid], nothing sent;
//     each constructor's doc says what its backend refuses.
//
// # Waiting
//
// On Redis, [Locker.Acquire] waits in the resource's queue, first come, first
// served across processes: the release that frees the lock grants it to the first
// live waiter in the same script and publishes the grant, so the waiter
// holds the lock when the message arrives. A waiting Acquire does not sleep
// past a holder that vanished: the first waiter of the queue tries when the
// lease runs out, the second 20ms and the third 40ms later (in case those
// ahead of them vanished too), and every script that changes who is first
// names the first three waiters and the lease's remaining time on the
// resource's channel, so each learns its place at once; the others only
// refresh their entry, once a second.
//
// A waiter that gives up (its context ended) leaves the queue in one round
// trip and costs the others nothing: the next one is told at once and
// tries when the lease ends, at once if the lock is free. A waiter that
// vanished (its process or its network died) stays queued until its entry
// lapses, 3s after its last refresh, and may be handed the lock meanwhile:
// it costs the first live waiter behind it at most the lease it asked for
// plus 50ms, while no more than two vanished waiters stand ahead of that
// one (three, when the lock was released rather than lost); past that,
// each further one can cost up to a second more, until the live waiter's
// refresh finds it. A loaded machine adds its scheduling delays to these
// bounds. Measured on a 2-core machine with a load average of 25-40 (go
// test -run 'TestWaiterThatGivesUpCostsNothing|TestVanished' -v ./lock,
// ten runs): three waiters at the head gave up 200ms before an unreleased
// lease's end, and the fourth had the lock 2-183ms after that end (half
// the runs within 30ms); a holder renewing a 300ms lease and the head of
// the queue, which had asked for a 100ms lease, were cut off from Redis,
// and the next waiter had the lock 121-170ms after the lease's end; two
// cut-off waiters with 100ms leases at the head, the live third had it
// 223-322ms after the release.
//
// Call [Locker.Close] when done with a Locker: it stops the subscription
// that waiting calls share, and every renewal. A waiter still waiting then
// leaves the queue and retries on the wait strategy, as with [WithWait].
//
// # Tokens and lost data
//
// Tokens are anchored to the Redis server's clock (max(previous token + 1,
// server time in microseconds)), so token state need only live while a
// resource is active ([WithTokenRetention]), and a lock whose Redis lost its
// data (a restart without persistence, a failover, FLUSHALL) still issues
// tokens that storage admits. If the server's clock went back, storage
// refuses the low tokens as stale and nothing is lost; [Locker.Advance] with
// the refusal's mark ([fence.LostTo]) heals at once. After a stale
// refusal, drop the unit of work or start it again from its fenced read
// with a new grant's fence; never retry only the refused write.
//
// # Deadlines
//
// Every call returns by its context's deadline, whatever the client's
// options; cleanup that must outlive it runs in the background, bounded
// (2 s), and [Locker.Close] waits for it within that bound.
//
// go-redis ends a read from a server that accepted the command and then
// went silent at the context's deadline only when the client was made with
// ContextTimeoutEnabled; otherwise (its default) at its ReadTimeout, 5 s by
// default in go-redis v9, or never with ReadTimeout -1. A Locker on a client
// made with ContextTimeoutEnabled (a *redis.Client, *redis.ClusterClient or
// *redis.Ring, as the universal and failover constructors make them) hands
// each call to it directly when the context has a deadline: that costs
// nothing, and is the recommended setup. A call whose context has no
// deadline goes to the client directly too, whatever its options. With any
// other client and a context with a deadline, each call runs in a
// goroutine, and the caller returns when its context ends, with an error
// matching ctx.Err(); the command may still reach Redis, and stays in the
// client until the client gives up on it (one read timeout: go-redis
// retries nothing once the context has ended) or is closed. An acquisition
// cut short this way is released once its command has returned, so no lock
// is left that nobody knows about; Close waits for such commands only
// within its bound, and closing the client ends the rest. (A call that went
// to the client directly and whose context is cancelled before its
// deadline, or has none, still waits for its reply, the deadline or the
// read timeout: go-redis watches deadlines, not cancellation. A goroutine
// per call to return early on cancellation would cost a thread woken on
// every call.)
//
// # Errors
//
// [ErrNotAcquired] (as a [*NotAcquiredError] that says how long the current
// lease has left), [ErrNotHeld] when a lease was already lost (and, with
// [ErrReleased], from [Lease.Err] after a release), [fence.ErrInvalid] for
// rejected arguments (nothing is sent), [fence.ErrWrongType] when a key of another
// type is in the way (it is left as it was), [ErrTokensExhausted] at the top
// of the token space, and [ErrNoQuorum] (as a [*QuorumError] naming each
// failing node) from a Redlock Locker. Calls whose context ends return an
// error that matches ctx.Err() and leave no lock behind.
//
// A call to a Redis server that is down fails with the dial error, and
// go-redis also logs each failed dial on the standard logger, several lines
// for one call; call redis.SetLogger once at start-up to silence those lines
// or route them to your own logger.
//
// # Operations
//
// A Locker reports metrics and spans through OpenTelemetry's global
// providers unless [WithMeterProvider] or [WithTracerProvider] say
// otherwise; while no SDK is installed there it skips them at no cost, and
// it records from the moment one is. The Redis settings fencekit wants
// (durability, eviction), the keys and channels a resource uses, failover
// in Redis Cluster and with Redlock, and what to alert on are in
// docs/operations.md in the repository:
// https://github.com/fencekit/fencekit/blob/main/docs/operations.md
package lock

// Where things are, for those who work on this package (not part of its
// documentation):
//
//   - internal/lockbackend (outside this package): the contract between
//     the portable Locker and Lease and the backends that hold the locks
//     (grant, extend, release, ttl, abandon, the queue, the record beside
//     the lock); its package doc states what every backend promises;
//   - locker.go: Locker, New, the one constructor behind every backend
//     (open), TryAcquire and one try of an acquisition over the backend,
//     Advance; redisnames.go: As and the Redis names; redlock.go:
//     NewRedlock and its public errors;
//   - wait.go: Acquire's waiting over the backend's queue (tries,
//     refreshes, hand-overs), or its polling;
//   - lease.go, lifecycle.go, lease_validity.go, renew.go: a Lease, what it
//     knows of its expiry, its end, its renewal;
//   - owner.go, do.go, foreign.go: Owner holds, Do, FenceLock;
//   - options.go, acquire_options.go, errors.go, telemetry.go,
//     background.go: options, errors, spans and metrics, cleanup that
//     outlives a call;
//   - internal/redisbackend: the Redis and Redlock backends, nothing
//     portable: redis.go (grant, release, extension, ttl, advance and
//     holds: one script each, try.lua for a plain try and acquire.lua
//     otherwise), calls.go (calls that keep the deadline), queue.go (the
//     wait queue's client side: entry lives, grant messages), subscribe.go
//     and redis_waiter.go (the subscription multiplexer shared by a
//     Locker's waiters, which is the backend's queue), record.go (the
//     record beside the lock that the election keeps its leader in),
//     redlock.go, redlock_errors.go, redlock_record.go (Redlock: node
//     fan-out, errors, record on a quorum; every node runs the single-node
//     scripts), scripts.go and *.lua (one idea each; tokenstate.lua and
//     handover.lua are shared helpers prepended to the scripts that issue
//     tokens or hand the lock over).
