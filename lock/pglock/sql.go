package pglock

// The statements of the lock. Each is one round trip to one function that
// migration 00006_fencekit_lock.sql creates (00007 replaces the grant's and
// the release's with faster ones that answer the same); the functions do
// every check and every write in one statement, on the server's clock.
const (
	// acquireSQL grants, refuses or queues: see fencekit_lock_acquire.
	acquireSQL = `SELECT kind, token, remaining_ms, place, ref FROM fencekit_lock_acquire($1, $2, $3, $4, $5, $6)`

	// releaseSQL frees the lock or hands it to the first live waiter; with
	// $4 a waiter leaves the queue too.
	releaseSQL = `SELECT fencekit_lock_release($1, $2, $3, $4)`

	// extendSQL lengthens a lease, never shortening it.
	extendSQL = `SELECT fencekit_lock_extend($1, $2, $3, $4)`

	// setRecordSQL writes the record beside the lock, for its holder only.
	setRecordSQL = `SELECT fencekit_lock_set_record($1, $2, $3, $4, $5)`

	// keepRecordSQL keeps the record of a grant past its lease.
	keepRecordSQL = `SELECT fencekit_lock_keep_record($1, $2, $3, $4)`

	// advanceSQL raises a resource's counter, never lowering it.
	advanceSQL = `SELECT fencekit_lock_advance($1, $2, $3)`

	// ttlSQL reads what is left of a holder's lease.
	ttlSQL = `SELECT fencekit_lock_ttl($1, $2)`

	// recordSQL reads the record while the grant that wrote it holds the lock.
	recordSQL = `SELECT value, token, holder FROM fencekit_lock_record($1)`

	// reclaimSQL deletes rows of idle resources past their retention.
	reclaimSQL = `SELECT fencekit_lock_reclaim($1)`
)

// Channels the functions notify on.
const (
	// lockChannel carries "<resource mark> <granted> <token> <ref> <age
	// ms> <remaining ms> <first> <second> <third>" after a hand-over, a
	// release that found only lapsed waiters, or a change of who is first
	// (see fencekit_lock_notify).
	lockChannel = "fencekit_lock"
	// recordChannel carries "<resource mark> <token> <value>" after a
	// record write.
	recordChannel = "fencekit_lock_record"
)

// Replies of fencekit_lock_acquire, by kind.
const (
	replyRefused = 0 // refused; queued when a place is given
	replyGranted = 1 // granted now, with a new token
	replyHeld    = 2 // already held by this holder: a retry, or a hand-over
)

// Replies of fencekit_lock_set_record: a negative reply is minus the
// newer token the record names.
const (
	recordNotHeld = 0 // the holder no longer holds the lock
	recordWritten = 1 // the record names this grant
)

// notHeld is fencekit_lock_extend's and fencekit_lock_ttl's reply when the
// holder does not hold the lock.
const notHeld = -3

// freeLock is the remaining time a notification gives for a free lock.
const freeLock = -2
