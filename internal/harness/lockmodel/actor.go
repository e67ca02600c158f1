package lockmodel

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// errPanic is what Do's function panics with now and then.
var errPanic = errors.New("lockmodel: fn panics")

// actor draws its steps from rng until the run's budget ends.
func (m *model) actor(i int, l *lock.Locker, rng *rand.Rand, runEnd time.Time) {
	for m.ctx.Err() == nil {
		// Short leases, so that a run makes many grants; renewed ones
		// long enough for their renewals to land on a loaded machine.
		ttl := time.Duration(40+rng.IntN(200)) * time.Millisecond
		if m.cfg.LeaseScale > 1 {
			ttl *= time.Duration(m.cfg.LeaseScale)
		}
		switch x := rng.IntN(100); {
		case x < 30:
			m.try(i, l, rng, m.long(rng, ttl), "try", runEnd)
		case x < 62:
			m.acquire(i, l, rng, m.long(rng, ttl), false, runEnd)
		case x < 77:
			renewTTL := 150*time.Millisecond + ttl/2
			if m.cfg.RenewTTL > 0 {
				renewTTL = m.cfg.RenewTTL
			}
			m.acquire(i, l, rng, renewTTL, true, runEnd)
		case x < 90:
			m.do(i, l, rng, ttl, runEnd)
		default:
			sleep(m.ctx, time.Duration(1+rng.IntN(30))*time.Millisecond)
		}
	}
}

// long returns cfg.LongTTL one time in cfg.LongEvery when it is set, ttl
// otherwise; rng is drawn from only when it is set, so that the runs
// without it keep their schedules.
func (m *model) long(rng *rand.Rand, ttl time.Duration) time.Duration {
	if m.cfg.LongTTL > 0 && rng.IntN(cmp.Or(m.cfg.LongEvery, 8)) == 0 {
		return m.cfg.LongTTL
	}
	return ttl
}

func (m *model) try(i int, l *lock.Locker, rng *rand.Rand, ttl time.Duration, kind string, runEnd time.Time) {
	c := m.begin(i, runEnd)
	lease, err := l.TryAcquire(m.ctx, m.cfg.Resource, ttl)
	if err != nil {
		m.end(c, nil, err)
		if !errors.Is(err, lock.ErrNotAcquired) && m.ctx.Err() == nil {
			m.r.count("calls failed", 1)
		} else {
			m.r.count("tries refused", 1)
		}
		return
	}
	f := lease.Fence()
	m.end(c, &f, nil)
	g := &grant{actor: i, kind: kind, holder: f.Holder, token: f.Token, ttl: ttl, start: c.start, end: c.end}
	m.granted(g)
	m.hold(l, rng, lease, g, ttl, false)
}

// acquire waits for the lock until a deadline drawn from rng: a waiter
// that gives up, now and then.
func (m *model) acquire(i int, l *lock.Locker, rng *rand.Rand, ttl time.Duration, renew bool, runEnd time.Time) {
	deadline := time.Now().Add(time.Duration(50+rng.IntN(1500)) * time.Millisecond)
	c := m.begin(i, earliest(deadline, runEnd))
	ctx, cancel := context.WithDeadline(m.ctx, deadline)
	var opts []lock.AcquireOption
	kind := "acquire"
	if renew {
		opts = append(opts, lock.AutoRenew())
		kind = "renew"
	}
	lease, err := l.Acquire(ctx, m.cfg.Resource, ttl, opts...)
	cancel()
	if err != nil {
		m.end(c, nil, err)
		if ctx.Err() == nil {
			m.r.count("calls failed", 1)
		} else {
			m.r.count("waiters gave up", 1)
		}
		return
	}
	f := lease.Fence()
	m.end(c, &f, nil)
	g := &grant{actor: i, kind: kind, holder: f.Holder, token: f.Token, ttl: ttl, start: c.start, end: c.end}
	m.granted(g)
	m.hold(l, rng, lease, g, ttl, renew)
}

// do runs Locker.Do with a function that holds the lock a while and, now
// and then, panics.
func (m *model) do(i int, l *lock.Locker, rng *rand.Rand, ttl time.Duration, runEnd time.Time) {
	deadline := time.Now().Add(time.Duration(50+rng.IntN(1500)) * time.Millisecond)
	c := m.begin(i, earliest(deadline, runEnd))
	ctx, cancel := context.WithDeadline(m.ctx, deadline)
	defer cancel()
	hold := time.Duration(rng.IntN(int(ttl/time.Millisecond)/2+1)) * time.Millisecond
	panics := rng.IntN(3) == 0
	var got *fence.Fence
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				if p != errPanic {
					panic(p)
				}
				m.r.count("Do panics recovered", 1)
			}
		}()
		err = l.Do(ctx, m.cfg.Resource, ttl, func(ctx context.Context, f fence.Fence) error {
			got = &f
			m.end(c, &f, nil)
			m.granted(&grant{actor: i, kind: "do", holder: f.Holder, token: f.Token, ttl: ttl, start: c.start, end: c.end})
			sleep(ctx, hold)
			if panics {
				panic(errPanic)
			}
			return nil
		})
	}()
	if got == nil {
		m.end(c, nil, err)
	}
}

// hold keeps a lease for a while, extends it and reads its TTL now and
// then, and releases it early, late (after it ended: the release may meet
// another holder's lock) or never (it runs out). A renewed lease is held
// past its first validity and judged.
func (m *model) hold(l *lock.Locker, rng *rand.Rand, lease *lock.Lease, g *grant, ttl time.Duration, renew bool) {
	h := &held{lease: lease, g: g}
	m.register(h)
	bg := context.Background()
	if renew {
		sleep(m.ctx, ttl+ttl/5+time.Duration(rng.IntN(int(ttl/4)))) // past its first validity
		if time.Since(g.end) > ttl && m.ctx.Err() == nil {
			if m.faulted(g.start, time.Now()) {
				m.r.count("renewals not judged (a fault overlapped)", 1)
			} else {
				m.r.count(Renewal, 1)
				if lease.Err() != nil {
					m.r.count(renewalsLapsed, 1)
				}
			}
		}
		m.release(h, bg)
		return
	}
	if m.cfg.LongTTL > 0 && ttl == m.cfg.LongTTL {
		// A long lease is held until it ends, on its own or as its Locker
		// learns it lost: a Locker that does not learn it is believed past
		// the bound of a loss (Fault.Lose), where the promise check sees it.
		select {
		case <-lease.Done():
		case <-m.ctx.Done():
		}
		m.release(h, bg)
		m.r.count("long leases held to their end", 1)
		return
	}
	if rng.IntN(4) == 0 {
		m.mu.RLock()
		err := lease.Extend(bg, ttl+time.Duration(rng.IntN(200))*time.Millisecond)
		m.mu.RUnlock()
		if err != nil {
			m.r.count("extends refused", 1)
		} else {
			m.r.count("extends", 1)
		}
	}
	if rng.IntN(4) == 0 {
		if d, err := lease.TTL(bg); err == nil && d > 0 {
			m.r.count("TTL reads", 1)
		}
	}
	switch x := rng.IntN(100); {
	case x < 62:
		if v := lease.Validity(); v > 0 {
			sleep(m.ctx, time.Duration(rng.Int64N(int64(v/3)+1)))
		}
		m.release(h, bg)
	case x < 93:
		// Late: after the lease ended on the local clock, once another
		// holder has the lock (or a while has passed), so that the
		// release meets another holder's lock.
		time.Sleep(lease.Validity() + time.Duration(rng.IntN(20))*time.Millisecond)
		wait := time.Now().Add(m.cfg.LateWait)
		met := m.othersHeld(h)
		for !met && time.Now().Before(wait) && m.ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
			met = m.othersHeld(h)
		}
		if met && m.cfg.LateExtend && rng.IntN(2) == 0 {
			m.lateExtend(h, ttl)
		}
		m.release(h, bg)
		m.r.count("late releases", 1)
		if met {
			m.r.count(LateReleaseMet, 1)
			m.observe() // judge the other holder's promise now
		}
	default:
		// Left to run out: the lock is free at its end, perhaps with
		// waiters queued. The watcher drops it once it has ended.
	}
}

// lateExtend sends h's Extend after its lease ended, while another lease
// holds the lock: the server must refuse it (a lock extended for a caller
// that does not hold it would stand longer than its holder asked, and the
// caller would be told it holds a lock another has). Judged only when the
// other lease is believed, and not being released, both before the call
// and after its reply: the promise check then says the server held that
// lease throughout.
func (m *model) lateExtend(h *held, ttl time.Duration) {
	o := m.anotherHolding(h)
	if o == nil {
		return
	}
	err := h.lease.Extend(context.Background(), ttl)
	if !m.stillHolding(o) {
		m.r.count("late extends not judged (the other lease ended)", 1)
		return
	}
	m.r.count(Extend, 1)
	if err == nil {
		m.r.violate(Extend, "%s: lease %s (token %d) was extended while lease %s (token %d) held the lock throughout the call",
			m.b.Name, h.g.holder, h.g.token, o.g.holder, o.g.token)
	}
}

// release releases h's lease under the model's lock, so that no watcher
// read sees the release between reading Validity and its reply.
func (m *model) release(h *held, ctx context.Context) {
	m.mu.RLock()
	m.unregister(h)
	err := h.lease.Release(ctx)
	if err == nil {
		m.releasedNow(h.g)
	}
	m.mu.RUnlock()
	if err != nil {
		m.r.count("releases not held", 1)
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
