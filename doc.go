// Package fencekit makes writes made under a distributed lock safe.
//
// A Redis lock (SET key value NX PX ttl) gives mutual exclusion only while its
// holder is fast. A holder that pauses past its lease (a GC pause, a slow
// network, a suspended VM) still believes it holds the lock, and its late
// write overwrites the next holder's work: a lost update. Releasing by
// compare-and-delete does not prevent it, and neither does Redlock.
//
// fencekit closes that window with fencing tokens. Acquiring a lock with
// package lock also issues the resource's next token in the same Lua script
// and round trip, so every grant carries a token above every earlier grant's.
// The holder presents its [fence.Fence] (resource, token, holder id) with every
// read and write, and the storage adapters admit an operation only if its
// token is not older than the newest one they have admitted, raising that
// high-water mark in the same atomic step as the operation:
//
//   - storage/postgres: a guard row per resource, upserted conditionally as the
//     first statement of the caller's transaction (or in one pipelined batch
//     with the caller's statements), or a token column checked in the same
//     UPDATE; optimistic version columns as a second guard.
//   - storage/redis: values, their high-water mark and version in one hash,
//     checked and written by one Lua script.
//
// Reads that a later write depends on must be fenced too: a fenced read raises
// the mark, so an older holder can no longer slip a write in between. Safety
// comes from storage's atomic admission, not from Redis. Tokens are anchored
// to the Redis server's clock, so when Redis loses the lock or its token state
// (a restart without persistence, a failover, FLUSHALL) the next grant's
// token is still above every token storage has seen, and work resumes without
// intervention. After a stale refusal, drop the work or redo it whole from its
// fenced read; never retry only the refused write.
//
// Package fence holds the shared vocabulary and imports no driver, so a lock
// from another library (redsync, bsm/redislock) can drive the storage guards
// too. The end-to-end tests in this directory run the lock-set workload with
// pauses past the lease, Redis restarts and data loss, and show no lost update
// with fencing and lost updates without it.
package fencekit
