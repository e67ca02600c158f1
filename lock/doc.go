// Package lock is a Redis lock whose every grant carries a fencing token.
//
// A [Locker] grants a lease on a named resource to one holder at a time. The
// grant and its token come from one Lua script, in one round trip: the script
// sets the lock key (SET PX, only if absent) and, only if that succeeded,
// issues the resource's next token: max(previous token + 1, the Redis
// server's clock in microseconds). The token therefore strictly increases
// with every grant of the resource, and a [Lease] hands it to storage as a
// [fence.Fence] together with a holder id that is unique to the grant.
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
// "p{r}:lock" and the token state in "p{r}:token". Both share the hash tag
// {r}, so they sit in one Redis Cluster slot and one script can touch both.
// The lock key's value is the holder id, so only the holder can release
// ([Lease.Release]) or extend ([Lease.Extend]) its lease. A lock taken with
// [Owner] also has a hold record, "p{r}:holds", which expires with the lock.
// While [Locker.Acquire] waits, the resource has a wait queue, "p{r}:queue"
// (a sorted set of the waiters' holder ids, in arrival order) and
// "p{r}:waiting" (a hash of their entries); both expire within seconds of
// the last waiter leaving. Releases and grants are announced on the channel
// "p{r}:released" ([Locker.ReleaseChannel]), sharded on a cluster, in the
// same slot.
//
// # Waiting, renewal and loss
//
// [Locker.Acquire] does not poll. Once subscribed to the resource's
// channel, a waiter whose try is refused joins the resource's wait queue in
// that same try, and the release that frees the lock grants it to the first
// live waiter in the queue, in the release's own script: a new token, the
// waiter's lease, and a message on the channel from which the waiter takes
// its lease without a round trip of its own. So a contended grant costs two
// commands (the try that queued, the release) and a hand-off costs the
// release's way to Redis and the message's way back. Waiters are served in
// arrival order, across processes, also after a lease ran out: every try
// of Acquire, queued or not yet (a Locker that has not subscribed to the
// resource yet, a polling one), that finds the lock free with live waiters
// queued ahead of it hands it to the first of them, who hears of it at
// once, and is refused. A release with no live waiter queued
// announces that the lock is free, which wakes one waiter of each Locker to
// try. A queued waiter refreshes its entry every second (by trying again);
// the head of the queue also tries when the current lease runs out (a
// holder that vanished), the others have no reason to, so the tries per
// waiter stay near one a second however short the leases;
// an entry not refreshed for three seconds (a crashed process) is passed
// over, so a waiter that vanished can cost the others at most one of its
// own leases. Every grant and every re-entry of an [Owner] takes the
// caller's own entry out of the queue. A waiter that gives up leaves the
// queue, and gives back a grant that reached it as it gave up, which goes
// to the next waiter. [Locker.TryAcquire] respects the queue too: a free
// lock with live waiters queued goes to the first of them, and TryAcquire
// is refused.
//
// A Locker's waiters share one subscription connection (on a
// *redis.ClusterClient one per hash slot with waiters, using SSUBSCRIBE). A
// resource's channel stays subscribed for two seconds after its last waiter
// in the Locker left, so that the Locker's next Acquire of it queues with
// its first try rather than subscribing again. If
// the subscription fails, waiters retry on a timed backoff, never sleeping
// past the current lease, until it is back; a queued waiter's retry finds a
// grant whose message it missed. [WithWait] makes Acquire poll instead;
// polling waiters do not queue, and like every Acquire they respect the
// queue, so they take the lock only when it is free and no live waiter is
// queued: on a resource where other Lockers' waiters queue, that is when
// the queue is empty. Call [Locker.Close] when done with a
// Locker: it stops the subscription and every renewal.
//
// [AutoRenew] keeps a lease held until it is released, extending it
// whenever only two thirds of its TTL are left (at once for a grant that
// reached its waiter late); [Locker.Do] renews by default for as long as its
// function runs. Do's function has the type func(ctx context.Context, f
// fence.Fence) error: it gets the lease's fence to present to storage, and
// ctx is cancelled as soon as the lease is lost. Every TTL is sent and counted in whole milliseconds, as
// Redis keeps it. [Lease.Done] closes when a lease ends, on release or as
// soon as it is known lost (a renewal refused, Redis unreachable until the
// lease ran out, [Lease.Extend] or [Lease.TTL] finding it gone), and
// [Lease.Err] says why. Do cancels its function's context at that moment.
// None of this makes a paused holder safe: a holder that does not run
// cannot see Done close, which is why storage checks the fence.
//
// With [Owner], an acquisition is re-entrant for the named owner: the same
// fence and one more hold, the lock freed with the last hold. No
// re-entry, Extend or renewal ever shortens a lock: an extension only
// lengthens it, so no call takes away time that a hold was told it had,
// not even an earlier extension that reaches Redis late. Every script
// recognises a client retry of a run that already happened (go-redis
// retries after a lost reply), so a retried re-entry or hold release never
// counts twice.
//
// # Deadlines
//
// Every call returns by its context's deadline. Cleanup that must outlive
// a call (releasing a grant whose reply was lost, a waiter leaving the
// queue, [Lease.Release] with a context that has ended) runs in the
// background with a short timeout of its own, and [Locker.Close] waits for
// it. go-redis applies a context's deadline to dialling, to waiting for a
// pooled connection and to its retry pauses, but to a read from a server
// that accepted the command and then went silent (a network black hole)
// only when the client's ContextTimeoutEnabled option is set; without it
// such a read ends at the client's ReadTimeout (3s by default). Set it
// where calls must end by their deadline even then.
//
// # Token state lives only while a resource is active
//
// The token state (the newest token, and the current grant's token and a
// mark of its holder, about 170 bytes per resource in Redis) expires a
// retention window after the last lease ends ([WithTokenRetention], default
// [DefaultTokenRetention]), so locking a new resource per order or per user
// costs no memory for good. Tokens keep increasing once the state is gone
// because they are anchored to the server's clock: a later grant's clock is
// past every earlier token, provided the clock has not gone back past the
// last token issued. The state outlives its lease by the retention, and by
// however far its counter runs ahead of the clock (after [Locker.Advance]),
// so the clock only has to be trusted not to step back by more than the
// retention while a resource is idle.
//
// Safety never depends on the clock: if it does step back, the next tokens
// are low, storage refuses them as stale and nothing is lost; progress
// resumes when the clock passes the old tokens, or at once after
// [Locker.Advance] with the refusal's mark. Tokens stay at or below
// [fence.MaxToken] (Lua numbers are doubles); at the limit a grant fails
// with [ErrTokensExhausted] rather than repeat a token.
//
// # When Redis loses data
//
// A restart without persistence, a failover to a lagging replica, eviction or
// FLUSHALL can lose token state. Storage stays safe whatever is lost (it
// refuses low tokens as stale), and the lock heals by itself: the next grant's
// token comes from the server's clock, which is past every token the lost
// state had issued, so storage admits it without anyone calling
// [Locker.Advance]. A failover to a replica whose clock is behind the old
// master's delays that by the clock difference; Advance with the refusal's
// mark (see [fence.HighWater]) heals at once.
//
// Healing never resumes a half-done unit of work. After a stale refusal,
// drop the work, or start it again from its fenced read with a new grant's
// fence; never retry only the write with a newer token, which could overwrite
// a newer holder's update with a value computed from an old read.
//
// For the fewest refusals run Redis with appendonly yes (appendfsync always
// is the strongest setting) and maxmemory-policy noeviction. Token state and
// locks carry a TTL, so under a volatile-* policy Redis may evict them early:
// an evicted lock lets a second holder in (storage still refuses the older
// one's writes), and evicted token state is healed by the clock as above.
//
// # Redlock and Redis Cluster
//
// On a *redis.ClusterClient every key and channel of a resource carries
// the hash tag {resource}, so one resource lives on one master and its
// scripts never cross slots; a failover of that master to an asynchronous
// replica may lose locks and token state, which the clock-anchored tokens
// heal as above. [NewRedlock] instead holds each lease on a quorum of
// independent masters (the Redlock algorithm) with the same [Locker] and
// [Lease] API: validity is the TTL less the acquisition time and a drift
// allowance, a failed quorum is released on every node, and the token is
// the largest of the granting nodes' tokens, with their token state raised
// to it. That token is not a consensus value, and Redlock, like any Redis
// lock, can admit two holders after a pause or a node restart; storage
// admission is what keeps their writes apart.
//
// # Locks from other libraries
//
// [Locker.FenceLock] fences a lock that redsync, bsm/redislock or another
// library took, without replacing it: it issues a token for the grant only
// while the lock key still holds the grant's value, the same token for every
// call within one grant and a higher one for the next grant.
// Its tokens follow the same rule as this package's own: anchored to the
// server's clock, and kept only the retention after the lock's lease.
// [Locker.FenceLockAbove] issues a token above a given mark for a clock that
// stepped back.
//
// # Observability
//
// A Locker reports through OpenTelemetry: the metrics
// fencekit.lock.acquire.duration (by outcome), fencekit.lock.hold.duration,
// fencekit.lock.waiters, fencekit.lock.lost, fencekit.lock.renewals (by
// outcome) and fencekit.lock.token_state.misses (grants that found no token
// state: a resource's first grant within the retention, or state Redis
// lost; counted by single-node Lockers), and spans for TryAcquire, Acquire, Release and Extend carrying
// the resource, the token and the outcome. It uses the global providers
// unless [WithMeterProvider] or [WithTracerProvider] say otherwise; without
// an SDK the instruments are no-ops.
//
// # Errors
//
// [ErrNotAcquired] (as a [*NotAcquiredError] that says how long the current
// lease has left), [ErrNotHeld] when a lease was already lost (and, with
// [ErrReleased], from [Lease.Err] after a release), [ErrInvalid] for
// rejected arguments (nothing is sent), [ErrWrongType] when a key of another
// type is in the way (it is left as it was), [ErrTokensExhausted] at the top of
// the token space. Calls whose context ends return an
// error that matches ctx.Err() and leave no lock behind.
package lock
