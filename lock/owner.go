package lock

import "fmt"

// MaxOwnerLen is the longest owner id [Owner] accepts, in bytes.
const MaxOwnerLen = 256

// Owner makes the acquisition re-entrant for owner id: while a lease
// acquired with the same id holds the resource's lock, acquiring it again
// with that id succeeds at once, with the same fence (token and holder), and
// adds one hold. The lock is freed when every hold has been released; each
// [Lease] releases its own hold once, and releasing it again returns
// [ErrNotHeld]. Another owner, or a caller without an owner, is refused as
// long as any hold remains. Without Owner an acquisition never re-enters.
//
// Use an id that names one unit of work (a job id, a request id), never one
// shared by concurrent workers: holds of one owner are not exclusive of each
// other. id must be non-empty and at most [MaxOwnerLen] bytes.
//
// Holds are counted in Redis, as Redisson counts them: a hash next to the
// lock key records the owner, the token and one field per acquisition, so a
// client retry of a re-entry or of a release is recognised and never counts
// twice. A re-entry extends the lock to at least its own ttl; extending or
// renewing any hold extends the lock for all of them. No hold ever shortens
// the lock: a re-entry, [Lease.Extend] or a renewal of one hold sets the
// lock's expiry to the later of its current one and the hold's ttl from
// now, so what every other hold was told (its [Lease.Validity]) stays true.
func Owner(id string) AcquireOption {
	return func(c *acquireConfig) error {
		switch {
		case id == "":
			return fmt.Errorf("%w: empty owner id", errInvalid)
		case len(id) > MaxOwnerLen:
			return fmt.Errorf("%w: owner id of %d bytes is longer than %d", errInvalid, len(id), MaxOwnerLen)
		}
		c.owner = id
		return nil
	}
}
