package lock

import "time"

// Validity returns how much longer the lease is known to be held, on the
// local clock: its TTL less the time since the grant, or its last
// successful extension, was sent; for a Locker made by [NewRedlock] also
// less the drift allowance, so an acquisition that took long starts with
// less. It is zero once the lease has ended or run out, or once its backend
// learned that the server no longer holds it (etcd: a revoked lease, a lost
// key). A lease acquired
// with [Owner] and without [AutoRenew] shares its lock with other holds
// that may extend it, so it tracks no expiry: Validity returns -1 while it
// is held.
//
// Validity asks no server. Work that must finish under the lease should
// finish well within it, and still present the fence to storage: a pause
// after the check outlasts any check.
func (s *Lease) Validity() time.Duration {
	s.checkLost()
	s.life.mu.Lock()
	ended, deadline := s.life.ended, s.life.deadline
	s.life.mu.Unlock()
	switch {
	case ended:
		return 0
	case deadline.IsZero():
		return -1
	}
	return max(time.Until(deadline), 0)
}
