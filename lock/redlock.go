package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
	"github.com/redis/go-redis/v9"
)

// The Redlock backend lives in lock/internal/redisbackend beside the
// single-deployment one; these are its public names.

// DefaultNodeTimeout is how long a Redlock [Locker] waits for each node when
// no [WithNodeTimeout] option is given.
const DefaultNodeTimeout = 50 * time.Millisecond

// ErrNoQuorum means a Redlock call reached fewer nodes than its quorum
// needs: too many nodes were down, unreachable or slower than the node
// timeout, or (for an acquisition) took so long that no validity was left
// or could not raise a quorum's token state to the lease's token.
// Errors that match it are a [*QuorumError]; when some node had the lock
// granted to another holder, the error also matches [ErrNotAcquired], and
// [Locker.Acquire] keeps trying.
var ErrNoQuorum = errors.New("lock: no quorum of Redlock nodes")

// WithNodeTimeout sets how long a Locker made by [NewRedlock] waits for each
// node's reply to one call. default: [DefaultNodeTimeout].
//
// Keep it far below the leases you take: an acquisition's validity is its
// TTL less the time it took, so a node timeout near the TTL lets one slow
// node make every acquisition fail. d must be between 1ms and [MaxTTL].
// [New] refuses this option: a single deployment has no node to give up on.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > MaxTTL {
			return fmt.Errorf("%w: node timeout %v is outside [1ms, %v]", errInvalid, d, MaxTTL)
		}
		c.perNode = d
		c.given |= lockbackend.GivenNodeTimeout
		return nil
	}
}

// NewRedlock returns a Locker that holds each lease on a quorum of
// independent Redis masters, as the Redlock algorithm describes: the same
// [Locker] type, methods and [Lease] as [New] gives, so code switches by
// changing its constructor. clients are one client per master (each may
// itself be a cluster client); they must not share a server, or a node
// would vote twice. The quorum is len(clients)/2+1: 2 of 3, 3 of 5, and
// with an even count more than half (3 of 4), so two holders can never both
// have one.
//
// An acquisition sends acquire to every node in parallel, each bounded by
// the node timeout ([WithNodeTimeout]). It holds the lease only if a quorum
// granted it and time is left: validity = ttl − elapsed − drift, where
// drift = ttl/100 + 2ms allows for clocks running at different rates. The
// lease is then known held until that validity runs out (see
// [Lease.Validity]); [Lease.Done] closes then unless the lease is extended.
// A ttl under 3ms could never leave validity and is refused with
// [fence.ErrInvalid] before anything is sent. When the quorum fails, the attempt
// releases what it took on every node, not only those that answered, before
// returning a [*QuorumError]; it waits for those releases no longer than
// its context allows, and [Locker.Close] waits for the rest.
// [Locker.Acquire] retries after a random delay ([Backoff], or the
// [WithWait] strategy) while some node reports another holder, rather than
// waiting for release announcements, so contending clients do not retry in
// step and split the vote; it stops at once when too many nodes failed.
//
// Release and Extend go to every node. Extend keeps the lease only when a
// quorum extended it with validity left; a lease that a quorum no longer
// holds is lost ([ErrNotHeld], and Done closes). An extension never
// shortens a node's lock, so a failed Extend leaves [Lease.Validity] as it
// was, and a successful one counts what a quorum holds. [Lease.TTL] reports the
// time for which a quorum still holds the lock. [Locker.Advance] raises
// the token state on every node and succeeds once a quorum has it.
// [Owner] and [Locker.FenceLock] are refused with [fence.ErrInvalid]: holds would
// be counted per node, so a re-entry could land on a different quorum than
// the grant, and a foreign lock is fenced on one of its servers with [New].
//
// NewRedlock adds a hook to each client (once per client, however many
// Lockers share it) that remembers the client's latest failed dial, so a
// node that did not answer is reported by its own connection error
// ("connect: connection refused") rather than by a timeout alone. The hook
// changes nothing the client does and stays with the client.
//
// # Tokens
//
// Every granting node issues its own token (its server clock in
// microseconds, or its previous token plus one), and the lease's token is
// the largest of them. The granting nodes' token state is then raised to
// that token, and the lease is handed out only once a quorum of nodes is
// known to hold token state at it (they issued it, or confirmed the raise),
// so a later grant, whose quorum shares at least one node with that one,
// gets a higher token while that state lives, and a client retry of a
// node's acquisition returns the lease's token. When too few raises are
// confirmed (a node timed out, or lost the grant), the attempt is released
// on every node and fails with a [*QuorumError] that [Locker.Acquire]
// retries, as it retries a quorum whose validity ran out.
//
// This token is not a consensus value. Nodes do not agree on it; a node that
// restarts empty, a lagging clock, or a grant whose quorum overlaps the last
// one only on a node that lost its state can issue a token lower than an
// earlier lease's. Redlock itself can also admit two holders at once, after
// a pause, a clock jump or a node restart. None of this loses an update,
// because safety never comes from the lock: storage admits a fenced read or
// write only if its token is not below the highest it has admitted, in the
// same atomic step as the operation (see package fence). A low token is
// refused as stale, which costs progress, never data.
//
// Each Redlock call costs one round trip per node, sent in parallel; an
// acquisition adds a second one to raise the token state on the nodes whose
// token was below the largest. Acquire polls; no subscription is opened.
func NewRedlock(clients []redis.UniversalClient, opts ...Option) (*Locker, error) {
	mk, err := redisbackend.NewRedlock(clients, DefaultNodeTimeout)
	if err != nil {
		return nil, err
	}
	return open(opts, mk)
}

// QuorumError is a Redlock call that fewer nodes than its quorum answered as
// asked. It matches [ErrNoQuorum], and also [ErrNotAcquired] when some node
// had the lock granted to another holder (then [Locker.Acquire] tries
// again).
type QuorumError struct {
	Op       string // "acquire", "release", "extend", "ttl" or "advance"
	Resource string
	Nodes    int // nodes asked
	Quorum   int // nodes needed
	OK       int // nodes that did as asked
	Held     int // nodes where another holder has the lock (acquire)
	// Unraised counts, for an acquisition that a quorum granted, the
	// granting nodes whose token state was not confirmed raised to the
	// lease's token (the raise failed, went unanswered, or found the grant
	// gone). The lease is refused when fewer than Quorum are left at it.
	Unraised int
	// Remaining is the shortest remaining lease among the other holder's
	// nodes, or negative when unknown.
	Remaining time.Duration
	// Elapsed is how long the call took.
	Elapsed time.Duration
	// Err joins the failures of the nodes that did not answer, or nil.
	Err error
}

// Error says how many nodes did what and why the rest did not.
func (e *QuorumError) Error() string {
	s := fmt.Sprintf("lock: %s %q: %d of %d Redlock nodes, %d needed", e.Op, e.Resource, e.OK, e.Nodes, e.Quorum)
	if e.Held > 0 {
		s += fmt.Sprintf("; %d held by another holder", e.Held)
	}
	switch {
	case e.OK >= e.Quorum && e.OK-e.Unraised < e.Quorum:
		s += fmt.Sprintf("; only %d hold token state at the lease's token", e.OK-e.Unraised)
	case e.OK >= e.Quorum:
		s += fmt.Sprintf("; no validity left after %v", e.Elapsed.Round(time.Microsecond))
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns [ErrNoQuorum], a [*NotAcquiredError] when another holder
// was seen or a quorum granted but the acquisition ran out of validity or
// could not raise a quorum's token state (all worth retrying), and the
// nodes' failures.
func (e *QuorumError) Unwrap() []error {
	errs := []error{ErrNoQuorum}
	if e.Op == "acquire" && (e.Held > 0 || e.OK >= e.Quorum) {
		errs = append(errs, &NotAcquiredError{Resource: e.Resource, Remaining: e.Remaining})
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func init() {
	redisbackend.ErrNoQuorum = ErrNoQuorum
	redisbackend.QuorumError = func(q redisbackend.QuorumFailure) error {
		e := QuorumError(q)
		return &e
	}
}
