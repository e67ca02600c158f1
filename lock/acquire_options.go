package lock

// AcquireOption configures one acquisition by [Locker.TryAcquire],
// [Locker.Acquire] or [Locker.Do]. Options validate themselves: an invalid
// one makes the call return an error matching [fence.ErrInvalid] before anything
// is sent.
type AcquireOption func(*acquireConfig) error

type acquireConfig struct {
	autoRenew bool
	owner     string
}

func newAcquireConfig(opts []AcquireOption) (acquireConfig, error) {
	if len(opts) == 0 {
		return acquireConfig{}, nil // c below escapes to the heap
	}
	var c acquireConfig
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// AutoRenew keeps the lease held until [Lease.Release]: it extends the lease
// to its full TTL, from a goroutine that ends with the lease. Each renewal
// is scheduled from what is left of the lease, not from its nominal TTL:
// when two thirds of the TTL are left, which is after a third of the TTL
// for a lease just granted or extended and at once for one that starts
// with less (a grant that reached a waiter late), so the first renewal
// never comes after the lease ran out on the server; after a failed
// renewal, within a third of what is left.
//
// A renewal that the backend refuses (the lease was lost: it expired during
// a pause, was deleted, or the server lost it) ends the lease at once;
// renewals that keep failing (the server unreachable) end it when the last
// successful one runs out, measured on the local clock from before that
// renewal was sent, so the lease is never believed held after the server
// may have let it go. Either way
// [Lease.Done] closes and [Lease.Err] says why. [Locker.Close] stops every
// renewal of the Locker's leases, and leases acquired after it are not
// renewed; they run out their TTL.
//
// Renewal keeps the lock while the holder is alive and connected; it does
// not make a paused holder safe. Keep presenting the fence to storage.
func AutoRenew() AcquireOption {
	return func(c *acquireConfig) error {
		c.autoRenew = true
		return nil
	}
}
