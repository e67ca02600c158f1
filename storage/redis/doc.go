// Package redis keeps byte values in Redis and admits their reads and writes
// by fence (see package fence) and by version, each in one Lua script and one
// round trip.
//
// # Layout
//
// Every value lives in one Redis hash under the store's prefix (default
// [DefaultPrefix]) followed by the caller's key. The hash holds the value's
// bytes, its version, its optional expiry, the key's high-water mark (the
// newest fence admitted for the key, with the resource that fence was for),
// and the records of its recent writes (see Retries below).
// One key means one Redis Cluster slot, so every script touches one slot; a
// hash tag in the caller's key (such as "{user42}:cart") decides that slot,
// because the prefix may not contain braces. The store takes the narrowest
// client it needs, a [goredis.Scripter]: a *goredis.Client or a
// *goredis.ClusterClient both serve.
//
// # Fenced operations
//
// [Store.Get], [Store.Set], [Store.SetIfVersion] and [Store.Delete] take the
// fence of a lock holder (from this module's lock package or any lock that
// gives out strictly increasing tokens per resource). Each admits its fence
// only if its token is above the key's mark, or equal to it and presented by
// the mark's own holder; when it admits, it raises the mark to the fence in
// the same script as the read or write. A refused fence gets a
// [*fence.StaleError] that carries the mark (so a lock that lost its counter
// can advance past it) and changes nothing.
//
// Reads are fenced too: once [Store.Get] has admitted a holder, no older
// holder can write the key, even if its lease expired long ago and it only
// now wakes up. Get raises the mark even when the key holds no value yet, and
// a delete keeps the mark, so the guarantee holds for missing and deleted
// values as well. [Store.Update] bundles the usual pattern: fenced read, the
// caller's function, fenced write that also requires the version it read.
//
// The mark is kept per key, not per resource. The first fence to touch a key
// binds the key to its resource, and a fence for another resource later gets
// a [*ResourceError] (matching [ErrResourceMismatch]): tokens of different
// resources come from different counters and cannot be compared. One
// resource may guard many keys.
//
// # Versions without a lock
//
// Every write, every delete of a live value and every expiry moves the key's
// version on by one; it never goes back while the key's hash exists.
// [Store.Load] reads without a fence, [Store.CompareAndSet] and
// [Store.CompareAndDelete] write only at the version the caller expects and
// return a [*fence.ConflictError] otherwise, and [Store.Modify] retries such
// a read-modify-write a bounded number of times. These need no lock and
// neither check nor move the mark.
//
// The mark and the version are per key: nothing fences across keys. A
// read-modify-write that reads one key and writes another (say, reads a
// balance under "{acct}:a" and writes a total under "{acct}:b") is checked
// only on the key it writes; a newer holder's write to the key that was read
// does not make it fail. Read every key the write depends on with a fenced
// [Store.Get] under the same fence before writing, or keep what must change
// together in one value.
//
// # Retries
//
// go-redis sends a command again after a connection reset or a read timeout
// (Options.MaxRetries, 3 by default), even when the server ran it and only
// the reply was lost. Every write therefore carries an id unique to the call,
// and the key's hash records the reply of each write under its id for the
// retry window ([WithRetryWindow], default [DefaultRetryWindow]). A run that
// finds its own id recorded is such a retry: before any fence or version
// check, it returns the first run's reply, whatever other clients wrote in
// between. So a write is never applied twice, and a write that was applied is
// never reported as stale or as a conflict. [Store.Update] and [Store.Modify]
// never apply their function's change twice.
//
// The records cost memory: up to about 170 bytes per write, kept for the
// window and dropped a few at a time by later writes of the same key, so a
// key holds about the records of its writes of the last window (a key
// written 1,000 times a second holds about 10 MB with the default window).
// Refusals change nothing and are not recorded (a retry is refused again),
// nor is a [Store.CompareAndDelete] of a key that never existed (there is
// nothing to record it in; a retry after another client created the key
// reports a conflict). Reads are not recorded either: a retried [Store.Get]
// reads the key afresh, and may be refused if a newer holder came in between.
//
// # Expiry
//
// Redis 7 cannot expire one field of a hash, and expiring the whole hash
// would drop the mark with the value: a holder paused past the value's
// lifetime could then write again. So [WithTTL] stores the value's expiry as
// a field, read against the Redis server's clock by every script: an expired
// value reads as missing and counts as deleted at its expiry. Its bytes stay
// in memory until the next fenced operation or write on the key. The hash
// itself, with its mark, is kept forever unless [WithMarkRetention] lets Redis
// collect it once it has gone that long without a live value and without an
// operation (a refused one counts); after that any fence is admitted again,
// so the retention must be far longer than any pause a holder can survive.
//
// # Eviction
//
// Without [WithMarkRetention] the store's hashes carry no Redis TTL, so a
// volatile-* maxmemory-policy (volatile-lru, volatile-lfu, volatile-random,
// volatile-ttl) never evicts them. With it, a hash that holds no live value,
// or an expiring one, carries a TTL and becomes evictable under those
// policies: Redis may drop it, mark and write records included, long before
// the retention ends, and then admit old fences and re-run retried writes.
// Under an allkeys-* policy any hash may be evicted, retention or not. Give
// the store's keys a server whose maxmemory-policy is noeviction (writes fail
// with an out-of-memory error instead, and nothing is lost), or use no
// retention under a volatile-* policy.
//
// # Observability
//
// Every script call is a span (fencekit.redis.get, .set, .delete, .load,
// .compare_and_set, .compare_and_delete) with the key, the fence and the
// outcome, and every refusal counts in fencekit.fence.rejections with
// storage="redis" and reason stale, conflict or resource_mismatch. The
// global OpenTelemetry providers are used unless [WithMeterProvider] or
// [WithTracerProvider] say otherwise.
//
// # Errors
//
// Stale fences get [fence.ErrStale], version mismatches [fence.ErrConflict],
// missing values [fence.ErrNotFound] (from Get and Load, which still return
// the key's version), and invalid fences [fence.ErrInvalidFence] (an empty
// resource or holder, a token below 1, a resource longer than
// [fence.MaxResourceLen] bytes). A key that holds another type, or a hash
// this store did not write, gets [ErrWrongType] naming the key, and is left
// as it was. Empty keys ([ErrInvalidKey]), bad options and arguments,
// including a nil context ([ErrInvalidOption]), and ended contexts (an error
// matching ctx.Err()) are reported before anything is sent. A context that
// ends while a script is in flight also gives an error matching ctx.Err(),
// but the script may have run: a fenced read with the same fence tells.
//
// # Round trips
//
// Each operation is one EVALSHA. The first call of a script on a server that
// has not cached it sends EVAL as well; [Store.Preload] loads the scripts in
// advance. [Store.Update] and [Store.Modify] are a read and a write: two
// round trips per attempt.
package redis
