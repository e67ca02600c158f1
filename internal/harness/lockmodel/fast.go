package lockmodel

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// released is a release that answered "held", for the release check.
type released struct {
	g      *grant
	reply  time.Time
	judged bool
}

// uncontended runs actor i's steps of the uncontended phase, until
// phaseDone closes: TryAcquire only, so that nobody queues. A try finds the lock
// free, held, or held by a lease that ran out (left to run out, or
// released late: after it ended, once another try took the lock). Leases
// are short and held briefly, so that the phase makes many grants.
func (m *model) uncontended(i int, l *lock.Locker, rng *rand.Rand, phaseDone <-chan struct{}, runEnd time.Time) {
	for m.ctx.Err() == nil && !closed(phaseDone) {
		ttl := time.Duration(25+rng.IntN(45)) * time.Millisecond
		c := m.begin(i, runEnd)
		lease, err := l.TryAcquire(m.ctx, m.cfg.Resource, ttl)
		if err != nil {
			m.end(c, nil, err)
			m.r.count("uncontended tries refused", 1)
			sleep(m.ctx, time.Duration(2+rng.IntN(8))*time.Millisecond)
			continue
		}
		f := lease.Fence()
		m.end(c, &f, nil)
		g := &grant{actor: i, kind: "uncontended try", holder: f.Holder, token: f.Token, ttl: ttl, start: c.start, end: c.end}
		m.granted(g)
		h := &held{lease: lease, g: g}
		m.register(h)
		switch x := rng.IntN(100); {
		case x < 60:
			// Released with nobody waiting: the fast path's release.
			sleep(m.ctx, time.Duration(rng.IntN(6))*time.Millisecond)
			m.release(h, context.Background())
		case x < 85:
			// Late, once another try took the lock (right after this
			// lease ran out, on the fast path): the release meets its
			// lock.
			time.Sleep(lease.Validity() + time.Duration(rng.IntN(10))*time.Millisecond)
			wait := time.Now().Add(m.cfg.LateWait)
			met := m.othersHeld(h)
			for !met && time.Now().Before(wait) && m.ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
				met = m.othersHeld(h)
			}
			if met && m.cfg.LateExtend && rng.IntN(2) == 0 {
				m.lateExtend(h, ttl)
			}
			others := m.othersHolding(h)
			m.release(h, context.Background())
			if met {
				m.r.count("uncontended late releases meeting another holder's lock", 1)
				m.dmu.Lock()
				m.lateMet = append(m.lateMet, others)
				m.dmu.Unlock()
				m.observe()
			}
		default:
			// Left to run out: the next try takes the lock after its
			// end.
			sleep(m.ctx, lease.Validity())
		}
		sleep(m.ctx, time.Duration(rng.IntN(4))*time.Millisecond)
	}
}

// releasedNow records g's release, which answered "held": the next
// observation sent judges it. The caller holds m.mu (read), as for the
// release itself.
func (m *model) releasedNow(g *grant) {
	r := &released{g: g, reply: time.Now()}
	m.dmu.Lock()
	m.rels = append(m.rels, r)
	m.relPending = append(m.relPending, r)
	m.dmu.Unlock()
}

// judgeReleases judges every release whose reply came before the
// observation o was sent: the server must not have its grant holding the
// lock any more (a holder id is granted once).
func (m *model) judgeReleases(sent time.Time, o Observation) {
	var bad []*released
	m.dmu.Lock()
	rest := m.relPending[:0]
	for _, r := range m.relPending {
		if !r.reply.Before(sent) {
			rest = append(rest, r)
			continue
		}
		r.judged = true
		m.r.count(Release, 1)
		if o.Holder == r.g.holder {
			bad = append(bad, r)
		}
	}
	clear(m.relPending[len(rest):])
	m.relPending = rest
	m.dmu.Unlock()
	for _, r := range bad {
		if m.lostBetween(r.reply, sent) {
			// Answered by a server lost since: its deletion may not have
			// been copied to the one that took over.
			m.r.count(FailoverReleasesExcused, 1)
			continue
		}
		m.violate(Release, "%s lease %s (%s) still held with token %d, %v after its release answered that it held it",
			m.b.Name, fence.HolderMark(r.g.holder), r.g.kind, o.Token, sent.Sub(r.reply))
	}
}

// othersHolding returns the holder ids of the leases other than h that
// are promised now.
func (m *model) othersHolding(h *held) []string {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	var hs []string
	for o := range m.holds {
		if o != h && o.lease.Validity() > 0 {
			hs = append(hs, o.g.holder)
		}
	}
	return hs
}

// judgeFast counts the grants and releases the server made on its fast
// path (as [Backend.Paths] tells) that a check judged.
func (m *model) judgeFast() {
	if m.b.Paths == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := m.b.Paths(ctx, m.cfg.Resource)
	if err != nil {
		m.r.count("fast paths unread", 1)
		m.t.Logf("%s: the fast paths: %v", m.b.Name, err)
		return
	}
	m.dmu.Lock()
	grants, releases := 0, 0
	for _, g := range m.grants {
		if g.judged && p.Grants[g.holder] {
			grants++
		}
	}
	for _, r := range m.rels {
		if r.judged && p.Releases[r.g.holder] {
			releases++
		}
	}
	late := 0
	for _, hs := range m.lateMet {
		for _, h := range hs {
			if p.Grants[h] {
				late++
				break
			}
		}
	}
	m.dmu.Unlock()
	m.r.set(FastGrantsJudged, grants)
	m.r.set(LateReleaseMetFast, late)
	m.r.set(FastReleasesJudged, releases)
	m.r.set("fast-path grants made", len(p.Grants))
	m.r.set("fast-path releases made", len(p.Releases))
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
