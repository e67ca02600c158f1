package pglock

import (
	"context"
	"time"
)

// Late grants. A grant's request may reach the server after its caller
// gave up (held in the network past the caller's deadline), or after a
// retry of it on another connection was granted and then released. Run
// then, it would grant the lock to a holder nobody has, for its whole
// lease. So every grant is sent with a deadline on the server's clock (no
// later there than the caller's deadline, or grantWindow after the send,
// is here), past which the statement changes nothing; and a grant whose
// fate is unknown when its caller gives up is voided (fencekit_lock_void)
// once that deadline has passed, which orders the void after any grant
// the request can still make. A late grant therefore stands at most until
// its deadline plus the void's round trip: by the caller's deadline, or
// grantWindow after the send for a caller without a deadline (documented
// in the package doc).

const (
	// grantWindow bounds how long after it is sent a grant may still be
	// made, for a caller whose context has no earlier deadline; a grant
	// the server reaches later is refused as too late, and sent again
	// while the caller waits.
	grantWindow = 5 * time.Second
	// clockRefresh is how often the mapping of the client's clock onto
	// the server's is read again.
	clockRefresh = 30 * time.Second
	// driftDivisor: deadlines are mapped as if the server's clock ran
	// 1/driftDivisor slower than the client's, so a clock rate error up to
	// that (0.1 %) never makes a server deadline later than the client's.
	driftDivisor = 1000
	// tooLateTries bounds how often one try is sent again after the
	// server answered that its deadline had passed.
	tooLateTries = 3
)

// clockRef maps the client's monotonic clock onto the server's: server is
// a clock_timestamp() the server read, local the client's time once its
// reply had come back. The server's clock at any later local instant x is
// at least server + (x - local), because the server read it before local.
type clockRef struct {
	server time.Time
	local  time.Time
}

// serverDeadline maps the local instant at onto the server's clock: a
// time the server's clock has not passed by the time the client's has
// passed at (within the drift the mapping allows), so a server deadline
// is never later than its client deadline. It reads the server's clock
// once when no mapping is known yet.
func (b *backend) serverDeadline(ctx context.Context, at time.Time) (time.Time, error) {
	ref := b.clock.Load()
	if ref == nil {
		r, err := b.readClock(ctx)
		if err != nil {
			return time.Time{}, err
		}
		ref = r
	} else if time.Since(ref.local) > clockRefresh {
		b.refreshClock()
	}
	d := at.Sub(ref.local)
	d -= max(d, -d) / driftDivisor
	return ref.server.Add(d), nil
}

// readClock reads the server's clock and keeps the mapping.
func (b *backend) readClock(ctx context.Context) (*clockRef, error) {
	var server time.Time
	if err := b.db.QueryRow(ctx, clockSQL).Scan(&server); err != nil {
		return nil, err
	}
	ref := &clockRef{server: server, local: time.Now()}
	b.clock.Store(ref)
	return ref, nil
}

// refreshClock reads the server's clock again in the background, once at
// a time.
func (b *backend) refreshClock() {
	if !b.clockBusy.CompareAndSwap(false, true) {
		return
	}
	select {
	case <-b.stop:
		b.clockBusy.Store(false)
		return
	default:
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		defer b.clockBusy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		_, _ = b.readClock(ctx)
	}()
}

// giveUp voids, once their deadlines have passed, whatever requests of
// holder's for resource may still grant (see lockbackend.LateRequests). It does not wait.
func (b *backend) giveUp(resource, holder string) {
	late, ok := b.late.Take(resource, holder)
	if !ok || b.noVoid {
		return
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		if d := time.Until(late); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			<-t.C // bounded by grantWindow; Close waits for it
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		for {
			err := b.void(ctx, resource, holder)
			if err == nil || ctx.Err() != nil || !mayHaveRun(err) && !isConnErr(err) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// void releases holder's grant of resource and its queue entry after
// writing the row (see voidSQL). On a database without migration 00012
// grants carry no deadline, and a release is all there is.
func (b *backend) void(ctx context.Context, resource, holder string) error {
	if b.olderSchema() {
		_, err := b.releaseAs(ctx, "release", resource, holder, true)
		return err
	}
	var held bool
	if err := b.db.QueryRow(ctx, voidSQL, resource, holder, ms(b.retention)).Scan(&held); err != nil {
		if olderSchemaError(err) {
			b.markOlderSchema()
			_, err = b.releaseAs(ctx, "release", resource, holder, true)
			return err
		}
		return translate(ctx, "release", resource, err)
	}
	return nil
}
