// Package redis keeps byte values in Redis and admits their reads and writes
// by fence (see package fence) and by version, each in one Lua script and one
// round trip.
//
// # Layout
//
// Every value lives in one Redis hash under the store's prefix (default
// [DefaultPrefix]) followed by the caller's key. The hash holds the value's
// bytes, its version, its optional expiry, and the key's high-water mark: the
// newest fence admitted for the key, with the resource that fence was for.
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
// Every version-checked write carries an id unique to the call, which the
// hash keeps. If the client retries such a write after losing the reply of a
// run that succeeded (go-redis retries after a read timeout), the retry
// finds its own id and reports that success instead of a version conflict,
// so [Store.Update] and [Store.Modify] never apply a change twice.
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
// operation; after that any fence is admitted again, so the retention must be
// far longer than any pause a holder can survive.
//
// # Errors
//
// Stale fences get [fence.ErrStale], version mismatches [fence.ErrConflict],
// missing values [fence.ErrNotFound] (from Get and Load, which still return
// the key's version), and invalid fences [fence.ErrInvalidFence]. A key that
// holds another type, or a hash this store did not write, gets [ErrWrongType]
// naming the key, and is left as it was. Empty keys ([ErrInvalidKey]), bad
// options ([ErrInvalidOption]) and ended contexts (an error matching
// ctx.Err()) are reported before anything is sent. A context that ends while
// a script is in flight also gives an error matching ctx.Err(), but the
// script may have run: a fenced read with the same fence tells.
//
// # Round trips
//
// Each operation is one EVALSHA. The first call of a script on a server that
// has not cached it sends EVAL as well; [Store.Preload] loads the scripts in
// advance. [Store.Update] and [Store.Modify] are a read and a write: two
// round trips per attempt.
package redis
