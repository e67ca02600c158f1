package pglock

// The statements of the lock. Each is one round trip; all but the
// uncontended grant and release are one call of a function that migration
// 00006_fencekit_lock.sql creates, which does every check and every write
// in one statement, on the server's clock (00007 and 00008 add faster ones
// that answer the same).
//
// On a pool that keeps its statements prepared (pgx's default; see
// statementsFor) the grant and release are plain SQL (grantSQL,
// releaseSQL): one UPDATE of the lock's row in a WITH clause, whose WHERE clause is the
// uncontended case of migration 00007, and the function of the full path
// called in the same statement only when that UPDATE matched no row
// (COALESCE and OR evaluate their second operand only then). A call of a
// PL/pgSQL function costs the server more than the UPDATE it would run.
//
// The clock of the uncontended UPDATE is now(): the time the server began
// the statement's transaction, which is the statement's own (each runs in
// a transaction of its own). The full path reads clock_timestamp() when it
// starts. Either is read before the row is locked, and the WHERE clause is
// evaluated again on the newest version of the row if the UPDATE had to
// wait for it (READ COMMITTED), with the same clock: a lease is taken as
// over, and a release as the holder's, only as of a time inside the call.
const (
	// grantSQL grants, refuses or queues, answering as
	// fencekit_lock_grant does ({kind, token, remaining_ms} or {kind,
	// token, remaining_ms, place, ref}): the free lock with an empty queue
	// and a counter the clock has passed goes to the caller in the
	// UPDATE; anything else goes to fencekit_lock_grant (migration 00008),
	// which decides as fencekit_lock_acquire does. From January 2255 on (the
	// token space ends in June 2255) the UPDATE matches no row and the function
	// decides in exact arithmetic. $3 is the lease, $4 the retention, in
	// ms; $5 the queue entry's life in ms (NULL: do not queue); $6 whether
	// the caller respects the queue; $7 the grant's deadline on the
	// server's clock (see serverDeadline), past which the statement
	// changes nothing and answers {3, 0, 0}: too late, the caller has gone
	// (fencekit_lock_grant_until, migration 00012). clock_timestamp() is
	// read when the UPDATE reads the row, and again if the row was written
	// meanwhile (fencekit_lock_void writes it for that).
	grantSQL = `WITH g AS (
    UPDATE fencekit_lock l SET holder = $2, token = round(date_part('epoch', now()) * 1000000)::bigint,
        expires_at = now() + $3::bigint * interval '1 millisecond',
        retain_until = now() + ($3::bigint + $4::bigint) * interval '1 millisecond'
    WHERE l.resource = $1 AND l.token > 0 AND NOT l.waiting
      AND l.token < CASE WHEN now() < '2255-01-01 00:00:00+00' THEN round(date_part('epoch', now()) * 1000000)::bigint ELSE 0 END
      AND (l.holder IS NULL OR l.expires_at <= now()) AND clock_timestamp() <= $7::timestamptz
    RETURNING ARRAY[1, l.token, $3::bigint])
SELECT coalesce((SELECT * FROM g), fencekit_lock_grant_until($1, $2, $3::bigint, $4::bigint, $5::integer, $6::boolean, $7::timestamptz))`

	// releaseSQL frees the lock or hands it to the first live waiter, and
	// answers whether the caller held it. The UPDATE frees a lock its
	// caller holds, live, with an empty queue and a counter the clock has
	// passed (the row is kept the retention, $3 ms, from now); anything
	// else goes to fencekit_lock_release_full (migration 00007).
	releaseSQL = `WITH r AS (
    UPDATE fencekit_lock l SET holder = NULL, expires_at = NULL,
        retain_until = now() + $3::bigint * interval '1 millisecond'
    WHERE l.resource = $1 AND l.holder = $2 AND l.expires_at > now() AND NOT l.waiting
      AND l.token <= round(date_part('epoch', now()) * 1000000)::bigint
    RETURNING 1)
SELECT EXISTS (SELECT FROM r) OR fencekit_lock_release_full($1, $2, $3::bigint, false)`

	// leaveSQL is releaseSQL for a waiter that gives up: its queue entry
	// goes too.
	leaveSQL = `SELECT fencekit_lock_release_full($1, $2, $3, true)`

	// grantCallSQL, releaseCallSQL and leaveCallSQL are grantSQL,
	// releaseSQL and leaveSQL as calls of functions alone (migrations
	// 00008 and 00007), for a pool that does not keep its statements
	// prepared on the server: there every statement is planned on every
	// call, and the plain SQL's plan costs far more than a function call's,
	// whose own statements stay planned in the session.
	grantCallSQL   = `SELECT fencekit_lock_grant_until($1, $2, $3, $4, $5, $6, $7)`
	releaseCallSQL = `SELECT fencekit_lock_release($1, $2, $3, false)`
	leaveCallSQL   = `SELECT fencekit_lock_release($1, $2, $3, true)`

	// acquireSQL and oldReleaseSQL are grantSQL and releaseSQL (and
	// leaveSQL, with $4) on a database without migration 00008 (see
	// fencekit_lock_acquire and fencekit_lock_release): the same answers,
	// more slowly.
	acquireSQL    = `SELECT kind, token, remaining_ms, place, ref FROM fencekit_lock_acquire($1, $2, $3, $4, $5, $6)`
	oldReleaseSQL = `SELECT fencekit_lock_release($1, $2, $3, $4)`

	// voidSQL releases a grant whose caller gave up, and its queue entry,
	// once the grant's deadline has passed on the server: it writes the
	// row first, so a grant that read the row before it checks its
	// deadline again (fencekit_lock_void, migration 00012).
	voidSQL = `SELECT fencekit_lock_void($1, $2, $3)`

	// clockSQL reads the server's clock, to map the client's deadlines
	// onto it.
	clockSQL = `SELECT clock_timestamp()`

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

// Replies of fencekit_lock_acquire and fencekit_lock_grant, by kind.
const (
	replyRefused = 0 // refused; queued when a place is given
	replyGranted = 1 // granted now, with a new token
	replyHeld    = 2 // already held by this holder: a retry, or a hand-over
	replyTooLate = 3 // the grant's deadline had passed: nothing changed
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
