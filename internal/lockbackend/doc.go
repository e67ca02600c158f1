// Package lockbackend is the contract between package lock's portable
// Locker and Lease and the backends that hold the locks: Redis (a single
// deployment or a Cluster), Redlock's independent masters, PostgreSQL
// (lock/pglock) and, later, etcd (the nested module lock/etcdlock) and the
// backends of the roadmap (MySQL, ZooKeeper, a Kubernetes Lease, Consul).
//
// A backend says only what differs between them: how a grant and its token
// are made, extended, released and read back, how a waiter hears of a
// hand-over, and how a record kept beside the lock (the election's leader)
// is written and watched. Everything else is written once, above it, in
// package lock and package election: the Lease lifecycle (what a process
// knows of its expiry, Done and Err), AutoRenew, Do, Owner holds' argument
// checks, the waiting strategies and the wait loop, telemetry, argument
// checks, cleanup that outlives a call, and the election's terms. The shape
// is database/sql's driver and Go CDK's driver.Bucket: users hold one
// concrete type (*lock.Locker), and a backend package is a constructor and
// an implementation of [Backend].
//
// # What every backend promises
//
// Each backend documents in docs/guarantees.md how it keeps these five
// promises; the lock model, the election model and the lost-update proof
// run against every backend to check them.
//
//  1. Tokens. A grant and its token come in one round trip. The token
//     strictly increases with every grant of a resource, across the
//     removal of the lock's state, a restart of the server and a failover,
//     or (where the backend cannot promise that, as Redis after data loss)
//     it is anchored to the server's clock in microseconds, so that storage,
//     whose marks only go up, refuses what went back and nothing is lost.
//     Tokens live in the one token space every guard compares
//     ([fence.Token], below [fence.MaxToken]): a resource moved from one
//     backend to another keeps being admitted only if the new backend's
//     tokens start above the old one's (clock-anchored tokens, about 1.8e15
//     in 2026, do). A resource must not be locked through two backends at
//     once.
//  2. Expiry. The server decides when a lease ends, in the statement or
//     script that grants or extends it, never on a client's clock. The
//     client believes less than the server holds: [Outcome.Known] and the
//     validity [Backend.Extend] returns are counted from before the call was
//     sent, and a backend whose servers' clocks may run at different rates
//     (Redlock) also takes a drift allowance off.
//  3. Waiting. A backend with a queue ([Queue]) grants a free lock to the
//     first live waiter in arrival order, across processes, in the same
//     step as the release that freed it, and wakes that waiter with the
//     grant ([HandOver]), not by polling. A waiter that gives up leaves the
//     queue in one call ([Backend.Abandon]); one that vanished is passed
//     over once its entry was not refreshed for [QueueLife]. A backend
//     without a queue says so ([Info.Queue] false), and the Locker polls on
//     its WaitStrategy.
//  4. The record. A [Recorder] keeps one record beside each resource's
//     lock that only the current holder can write, whose token only goes
//     up, which is read together with the check that its writer still
//     holds the lock, and whose writes can be watched.
//  5. Crash and failover. What a grant survives is stated per backend:
//     etcd loses nothing (its revisions are consensus values); Redis and an
//     unlogged PostgreSQL table lose leases on a crash, a second holder can
//     then be granted while the first still works, and clock-anchored
//     tokens keep storage safe.
//
// # Calls, errors and deadlines
//
// Every method returns by its context's deadline, whatever the client's
// own timeouts. A call whose reply was lost may still have run: a grant
// that may have been made is released by the backend itself (within ctx
// while it lasts, then through [Settings.Background]), so no lock is left
// that nobody knows about; a release or extension whose outcome is unknown
// returns an error matching [ErrReplyLost]. Errors match the sentinels of
// this package ([ErrNotHeld], [ErrTokensExhausted], [ErrReplyLost],
// [ErrUnsupported]) and of package fence ([fence.ErrInvalid] for a
// rejected argument, with nothing sent; [fence.ErrWrongType] for state of
// another shape in the way, left as it was), and an error whose context
// ended matches ctx.Err(). Package lock's exported sentinels are these
// values, so a backend's error matches them as they are.
//
// Arguments reach a backend already checked by package lock: a resource
// that [fence.Fence.Validate] accepts, without braces, at most
// [fence.MaxResourceLen] bytes; a TTL of whole milliseconds between 1ms and
// lock.MaxTTL; a fresh holder id from [fence.NewHolder]; a live context. A
// backend adds only its own limits (Redlock's smallest TTL), each refused
// with an error matching [fence.ErrInvalid].
package lockbackend
