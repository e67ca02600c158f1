package lockmodel

import (
	"context"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// judgeQueue judges, after the run, every grant against every waiter an
// observation found live and queued before the grant was asked for: the
// waiter, still waiting when the grant was made, must have been granted a
// lower token. It needs the backend's log of grants, since a waiter can be
// handed the lock and never learn it.
func (m *model) judgeQueue() {
	if m.b.Grants == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log, err := m.b.Grants(ctx, m.cfg.Resource)
	if err != nil {
		m.r.count("queue: log of grants unread", 1)
		m.t.Logf("%s: the log of grants: %v", m.b.Name, err)
		return
	}
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for _, o := range m.obs {
		for _, w := range o.o.Waiters {
			if w.Life <= 0 {
				continue
			}
			// Only calls that have ended are judged: their grant, if
			// any, is in the log read above.
			c := m.holderCall[w.Holder]
			if c == nil || !c.done {
				continue
			}
			// The entry stays live, unrefreshed, until at least this.
			live := o.sent.Add(w.Life - slack)
			for _, g := range m.grants {
				if g.holder == w.Holder || !g.start.After(o.reply) || !g.end.Before(live) {
					continue
				}
				// Still waiting when g was made: granted (it left the
				// queue only by a grant), or gave up after g's reply.
				if !c.granted && !(c.gaveUp && c.until.After(g.end)) {
					continue
				}
				p := queuePair{w.Holder, g.holder}
				if m.qJudged[p] {
					continue
				}
				m.qJudged[p] = true
				m.qAhead[g] = true
				m.r.count(Queue, 1)
				if tw, ok := log[w.Holder]; !ok || tw > g.token {
					m.violate(Queue, "%s waiter %s, live and queued ahead (observed %v before the grant was asked for, its entry live %v more), was %s after the grant of token %d to %s (%s)",
						m.b.Name, fence.HolderMark(w.Holder), g.start.Sub(o.reply), w.Life, servedAs(tw, ok), g.token, fence.HolderMark(g.holder), g.kind)
				}
			}
		}
	}
}

// queuePair is a waiter and the holder of a grant it was queued ahead of.
type queuePair struct{ waiter, holder string }

func servedAs(t fence.Token, ok bool) string {
	if !ok {
		return "never granted"
	}
	return "granted token " + t.String()
}
