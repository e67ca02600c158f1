// Package redis keeps byte values in Redis and admits their reads and writes
// by fence (see package fence) and by version, each in one Lua script and one
// round trip.
//
// # Layout
//
// Every value lives in one Redis hash under the store's prefix (default
// [DefaultPrefix]) followed by the caller's key, holding the value, its
// version, its optional expiry and the key's high-water mark; each call that
// changes something also leaves a small retry record in the same Redis
// Cluster slot (see Retries). A hash tag in the caller's key (such as
// "{user42}:cart") decides that slot. The store takes the narrowest client it
// needs, a [goredis.Scripter]: a *goredis.Client or a *goredis.ClusterClient
// both serve. A *goredis.Ring does not, and [New] refuses it: a Ring moves a
// shard's keys to another shard when it marks the shard down, and that shard
// holds no mark to refuse a stale fence. Programs on rueidis get the same
// Store, keys and scripts from the nested module lock/rueidisfence
// (rueidisfence.NewStore), which says how its retries differ; go-redis
// users pull no rueidis. Key names, memory and eviction are in docs/operations.md in the
// repository: https://github.com/fencekit/fencekit/blob/main/docs/operations.md
//
// # Fenced operations
//
// [Store.FencedGet], [Store.FencedSet], [Store.FencedSetIfVersion] and [Store.FencedDelete] take the
// fence of a lock holder (from this module's lock package or any lock that
// gives out strictly increasing tokens per resource). Each admits its fence
// only if its token is above the key's mark, or equal to it and presented by
// the mark's own holder; when it admits, it raises the mark to the fence in
// the same script as the read or write. A refused fence gets a
// [*fence.StaleError] that carries the mark (so a lock that lost its counter
// can advance past it) and changes nothing.
//
// Reads are fenced too: once [Store.FencedGet] has admitted a holder, no older
// holder can write the key, even if its lease expired long ago and it only
// now wakes up. FencedGet raises the mark even when the key holds no value yet, and
// a delete keeps the mark, so the guarantee holds for missing and deleted
// values as well. [Store.FencedUpdate] bundles the usual pattern: fenced read, the
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
// [Store.FencedGet] under the same fence before writing, or keep what must change
// together in one value.
//
// # Retries
//
// go-redis sends a command again after a connection reset or a read timeout
// (Options.MaxRetries, 3 by default), even when the server ran it and only
// the reply was lost. Every call that may change something therefore names
// a record key unique to the call, and a run that changes something stores
// its reply there for the retry window ([WithRetryWindow]). A run that finds
// its record is such a retry: before any fence or version check, it returns
// the first run's reply, whatever other clients wrote in between. So a write
// is never applied twice, and a write that was applied is never reported as
// stale or as a conflict. [Store.FencedUpdate] and [Store.Modify] never apply their
// function's change twice.
//
// A [Store.FencedGet] that raises the mark is recorded too; one that raises
// nothing (its fence is already the mark) writes nothing and only looks for
// the record of an earlier run of the same call. A retried FencedGet whose first
// run was admitted is therefore never refused: it returns what that run read
// while the value is unchanged, and an error matching [fence.ErrOutcomeUnknown]
// once the value has changed, since what the first run read is gone.
//
// Each record expires by itself at the end of its own window (Redis PX), so
// memory returns to the values alone one window after the last write, and
// no key grows with the write rate: a hot key's hash stays the size of its
// value, and its records are many small keys, each about 155 bytes of
// server memory whatever the key's length. Shorter client
// timeouts and fewer retries give a shorter window, and so fewer records. A store with a
// shorter window never touches another store's records. Refusals change
// nothing and are not recorded (a retry is refused again).
//
// The window must outlast the client's retries. [New] derives the client's
// retry horizon from its options (the formula is at [WithRetryWindow]:
// about 232 s with go-redis's defaults), uses it as the default window, and
// refuses a shorter one. Records carry a TTL, so a volatile-*
// maxmemory-policy may evict them early, and a retry after that runs again
// (see Eviction).
//
// # Outcomes
//
// A call reports that it applied (nil error, or a refusal that changed
// nothing), that it did not (any other error), or that the store cannot
// tell: an error matching [fence.ErrOutcomeUnknown], an
// [*fence.OutcomeUnknownError] that also matches its cause (ctx.Err(), the
// network error). The last happens when the call's context ends, or its
// connection breaks, after go-redis wrote its script to a connection and
// before a reply arrived, and go-redis's retries did not bring the reply
// back: the script may have run. The store counts how often go-redis wrote
// the command; a call whose command was never written (the server could not
// be reached, the context ended first), or whose only send got an error
// reply, did not apply and says so with a plain error.
//
// Every call returns by its context's deadline, whatever the client's
// options. A client made with ContextTimeoutEnabled ends its reads at the
// deadline itself and gets the call directly, as does a call whose context
// has no deadline. Any other client (go-redis's default) would wait for a
// silent server until its ReadTimeout, 5 s by default, past the deadline;
// the store then runs the call in a goroutine and returns when the context
// ends, and a write cut short this way reports an unknown outcome, since the
// client may still send it. The command stays in the client until the
// client gives up on it (one read timeout) or is closed. A direct call whose
// context is cancelled waits for its reply (or the read timeout), as every
// go-redis call does.
//
// What to do after an unknown outcome: read the key under the same fence
// ([Store.FencedGet]) and decide from what it holds, or run the work through an
// exactly-once record so that a retry tells the truth. Do not blindly retry
// a write with the same fence: the fence that was admitted once is admitted
// again, and the write may apply twice. A retry of [Store.CompareAndSet] with
// the version read before is safe: it conflicts if the first run applied.
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
// Stores with different retentions may share keys: a hash lives as long as
// the longest retention of the stores that wrote it, and for ever once a
// store without retention has written it.
//
// # Eviction
//
// Give the store's keys a server whose maxmemory-policy is noeviction. Under
// a volatile-* policy, retry records and, with [WithMarkRetention], hashes
// without a live value carry a TTL and may be evicted early, which lets a
// retried write run again or admits old fences; under allkeys-* any hash may
// go. docs/operations.md says more.
//
// # Observability
//
// Every script call is a span (fencekit.redis.get, .set, .delete, .load,
// .compare_and_set, .compare_and_delete) with the key (bytes that are not
// valid UTF-8 written as \xNN), the fence's resource and token (never its
// holder) and the outcome, and every refusal counts in fencekit.fence.rejections with
// storage="redis" and reason stale, conflict or resource_mismatch. The
// global OpenTelemetry providers are used unless [WithMeterProvider] or
// [WithTracerProvider] say otherwise.
//
// # Errors
//
// Stale fences get [fence.ErrStale], version mismatches [fence.ErrConflict],
// missing values [fence.ErrNotFound] (from FencedGet and Load, which still return
// the key's version), and invalid fences [fence.ErrInvalid] (an empty
// resource or holder, a token below 1, a resource longer than
// [fence.MaxResourceLen] bytes). A key that holds another type, or a hash
// this store did not write (any hash whose fields and values are not exactly
// of the shape the store writes), gets [fence.ErrWrongType] naming the key
// from every call, and is left as it was. Empty keys ([fence.ErrInvalid]), bad options and arguments,
// including a nil context and a retry window shorter than the client's
// retries ([fence.ErrInvalid]), and ended contexts (an error matching
// ctx.Err()) are reported before anything is sent; the invalid ones all
// match [fence.ErrInvalid]. A call that may have applied and cannot tell
// gets an error matching [fence.ErrOutcomeUnknown] (see Outcomes). Errors
// and spans name holders only by [fence.HolderMark]: a lock's holder id is
// what releases it.
//
// # Round trips
//
// Each operation is one EVALSHA. The first call of a script on a server that
// has not cached it sends EVAL as well; [Store.Preload] loads the scripts in
// advance. [Store.FencedUpdate] and [Store.Modify] are a read and a write: two
// round trips per attempt.
package redis
