package lockmodel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// slack is the clocks' rate allowance of the promise and queue checks,
// far above what a server's clock drifts from the local one over a lease.
const slack = 2 * time.Millisecond

// grant is one lease the workload was granted.
type grant struct {
	actor  int
	kind   string // "try", "acquire", "renew", "do"
	holder string
	token  fence.Token
	ttl    time.Duration // what the grant asked for
	// start is when the call that got it was made; end when its reply
	// came: the server granted it in between.
	start, end time.Time
	// judged says a check judged it: its token (tokens, anchor) or its
	// promise.
	judged bool
}

// call is one acquisition of an actor, for the queue check: which holder
// ids it sent, and how it ended.
type call struct {
	start, end time.Time
	// until is when the call's context ended it at the latest (its
	// deadline, or the end of the run): until then it kept its queue
	// entry, unless it was granted.
	until   time.Time
	granted bool
	token   fence.Token
	// gaveUp says the call ended by its context (deadline or the run's
	// end), which is the only way a waiter leaves the queue that the
	// check follows; a call that failed otherwise is not judged.
	gaveUp bool
	done   bool
}

// observed is one observation and when it was sent and replied.
type observed struct {
	sent, reply time.Time
	o           Observation
}

// held is a lease whose promise the watcher checks.
type held struct {
	lease *lock.Lease
	g     *grant
}

// window is a time during which a fault was injected.
type window struct{ from, to time.Time }

// deferredPromise is a promise found not held while a loss was being
// injected.
type deferredPromise struct {
	g     *grant
	reply time.Time
	bad   string
}

// excuse is the window of a [Fault.Lose]: the server may have ended the
// leases of actor's Locker granted before revoked from from on, and the
// Locker may believe them until until.
type excuse struct {
	actor                int
	from, revoked, until time.Time
}

type model struct {
	t   testing.TB
	b   Backend
	cfg Config
	r   *Result
	ctx context.Context // the workload's: ends with the budget

	// mu orders the calls that end or shorten a promise (RLock: Release,
	// Extend) against the watcher's reads (Lock: from reading Validity to
	// the observation's reply).
	mu sync.RWMutex

	dmu        sync.Mutex
	holds      map[*held]struct{}
	grants     []*grant
	obs        []observed
	cur        []*call
	holderCall map[string]*call
	faults     []window
	// amnesia are the windows of faults that lost a node's data
	// (Fault.LosesState).
	amnesia []window
	excuses []excuse
	// lost are the moments a [Fault.Fail] stopped a server: what it
	// granted or released alone may be gone.
	lost []time.Time
	// lossPending are the excuses of losses whose grant had not returned
	// when they were injected, by holder id: granted records them.
	lossPending map[string]excuse
	// losing says a loss is being injected; deferred are the promises
	// found not held meanwhile, judged once its excuse is known.
	losing   bool
	deferred []deferredPromise
	stopOnce sync.Once
	stop     context.CancelFunc
	// qJudged are the queue check's pairs judged so far, qAhead the
	// grants with a live waiter ahead.
	qJudged map[queuePair]bool
	qAhead  map[*grant]bool
	// rels are the releases that answered "held", relPending those no
	// observation has judged yet.
	rels       []*released
	relPending []*released
	// lateMet are, for each late release of the uncontended phase that
	// met another holder's lock, the holders promised then.
	lateMet [][]string
}

// Run runs the workload against b for cfg's budget and judges it. It
// fails t only when the run cannot be set up; the caller judges the
// Result ([Result.Check], [Result.Rejected]).
func Run(t testing.TB, b Backend, cfg Config) *Result {
	t.Helper()
	if cfg.Actors <= 0 {
		cfg.Actors = 5
	}
	if cfg.Budgets <= 0 {
		cfg.Budgets = 4
	}
	if cfg.Budget <= 0 {
		cfg.Budget = Budget(t)
	}
	if cfg.Seed == 0 {
		cfg.Seed = Seed(t)
	}
	if cfg.LateWait <= 0 {
		cfg.LateWait = 1500 * time.Millisecond
	}
	if cfg.Resource == "" {
		cfg.Resource = "lmodel:" + fence.NewHolder()[:12]
	}
	r := newResult(b.Name, cfg.Label, cfg.Seed)
	lockers := make([]*lock.Locker, cfg.Actors)
	m := &model{t: t, b: b, cfg: cfg, r: r, holds: map[*held]struct{}{}, cur: make([]*call, cfg.Actors),
		holderCall: map[string]*call{}, qJudged: map[queuePair]bool{}, qAhead: map[*grant]bool{}}
	defer func() {
		// Side by side: each Close may wait its bound (seconds) for
		// background releases, and the run judges nothing of it.
		var wg sync.WaitGroup
		for _, l := range lockers {
			if l != nil {
				wg.Go(l.Close)
			}
		}
		wg.Wait()
		if b.Close != nil {
			b.Close()
		}
	}()
	for i := range lockers {
		l, err := b.Locker(i, m.seen(i))
		if err != nil {
			t.Fatalf("%s: Locker of actor %d: %v", b.Name, i, err)
		}
		lockers[i] = l
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.ctx, m.stop = ctx, cancel
	start := time.Now()
	// The uncontended phase, if any, lasts cfg.Uncontended, and past it,
	// up to four times it, while a floor of the fast path's judgments is
	// not reached: a loaded machine makes fewer grants in the phase, and
	// the random workload after it makes none of the states those
	// judgments need. Only this goroutine ends the phase, so every actor
	// leaves it after the same decision; runEnd is set before phaseDone
	// closes. Calls that end by the run's end are followed as if it came
	// at the budget's end: the earliest it can come.
	phaseDone := make(chan struct{})
	var runEnd time.Time
	go func() {
		sleep(ctx, cfg.Uncontended)
		for cfg.Uncontended > 0 && ctx.Err() == nil && time.Since(start) < 4*cfg.Uncontended && m.fastShort() {
			m.r.count("uncontended phases extended (250ms each)", 1)
			sleep(ctx, 250*time.Millisecond)
		}
		phaseEnd := time.Now()
		runEnd = phaseEnd.Add(cfg.Budget)
		close(phaseDone)
		// The budget, and past it, up to cfg.Budgets times it, while a
		// floor of cfg.Floors is not reached yet: a loaded machine slows
		// the workload, not the judgments it must make.
		sleep(ctx, cfg.Budget)
		for ctx.Err() == nil && time.Since(phaseEnd) < time.Duration(cfg.Budgets)*cfg.Budget && m.short() {
			m.r.count("runs extended past the budget (250ms each)", 1)
			sleep(ctx, 250*time.Millisecond)
		}
		cancel()
	}()

	var wg sync.WaitGroup
	for i, l := range lockers {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		wg.Go(func() {
			if cfg.Uncontended > 0 {
				// Until the phase ends, its calls are followed to the
				// latest the run can end.
				m.uncontended(i, l, rng, phaseDone, start.Add(4*cfg.Uncontended+cfg.Budget))
			}
			select {
			case <-phaseDone:
			case <-ctx.Done():
				return
			}
			m.actor(i, l, rng, runEnd)
		})
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		rng := rand.New(rand.NewPCG(cfg.Seed, 1<<32))
		judged := time.Now()
		for ctx.Err() == nil {
			m.observe()
			time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
			if cfg.StopOnViolation && time.Since(judged) > 250*time.Millisecond {
				// A control stops at its first violation, of the queue's
				// check too: judge what has ended so far.
				m.judgeQueue()
				judged = time.Now()
			}
		}
	}()
	if cfg.Faults && len(b.Faults) > 0 {
		wg.Go(func() { m.inject(rand.New(rand.NewPCG(cfg.Seed, 1<<33))) })
	}
	wg.Wait()
	<-watchDone
	if b.Grants == nil {
		r.count("queue not judged (the backend keeps no log of grants)", 1)
	}
	m.judgeQueue()
	r.count(WaiterAhead, len(m.qAhead))
	m.judgeFast()
	// Renewals by rate: a loaded machine runs some late, most may not. A
	// rate needs a sample: most of at least five, or all of at least
	// three (a renewal that is broken lets every lease lapse; a loaded CI
	// machine let 2 of 3 lapse in an honest run).
	if n, lapsed := r.Count(Renewal), r.Count(renewalsLapsed); (n >= 5 && 2*lapsed > n) || (n >= 3 && lapsed == n) {
		r.violate(Renewal, "%s: %d of %d renewed leases held past their first validity had lapsed", b.Name, lapsed, n)
	}
	return r
}

// fastShort reports whether a floor of cfg.Floors on the fast path's
// judgments (what only the uncontended phase makes) is not reached yet.
func (m *model) fastShort() bool {
	short := false
	for _, k := range []string{FastGrantsJudged, FastReleasesJudged, LateReleaseMetFast} {
		n, ok := m.cfg.Floors[k]
		if !ok {
			continue
		}
		if !short {
			m.judgeFast()
		}
		if m.r.Count(k) < n {
			short = true
		}
	}
	return short
}

// short reports whether a floor of cfg.Floors is not reached yet.
func (m *model) short() bool {
	if len(m.cfg.Floors) == 0 {
		return false
	}
	_, q := m.cfg.Floors[Queue]
	_, a := m.cfg.Floors[WaiterAhead]
	if q || a {
		m.judgeQueue()
	}
	_, fg := m.cfg.Floors[FastGrantsJudged]
	_, fr := m.cfg.Floors[FastReleasesJudged]
	_, fl := m.cfg.Floors[LateReleaseMetFast]
	if fg || fr || fl {
		m.judgeFast()
	}
	for k, n := range m.cfg.Floors {
		c := m.r.Count(k)
		if k == WaiterAhead {
			m.dmu.Lock()
			c = len(m.qAhead)
			m.dmu.Unlock()
		}
		if c < n {
			return true
		}
	}
	return false
}

// seen returns the hook that tells the model actor's calls' holder ids.
// It pauses a queued waiter's try now and then (a waiter's second or
// later try), far less than its entry's life: so that a lease ends with
// the lock left free and a live waiter queued, the state in which every
// other try must respect the queue.
func (m *model) seen(actor int) func(holder string) {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(m.cfg.Seed, 1<<34+uint64(actor)))
	return func(holder string) {
		m.dmu.Lock()
		c := m.cur[actor]
		again := m.holderCall[holder] != nil
		if c != nil && !c.done {
			m.holderCall[holder] = c
		}
		m.dmu.Unlock()
		mu.Lock()
		pause := time.Duration(0)
		if again && rng.IntN(3) == 0 {
			pause = time.Duration(20+rng.IntN(300)) * time.Millisecond
		}
		mu.Unlock()
		if pause > 0 {
			m.r.count("queued tries paused", 1)
			time.Sleep(pause)
		}
	}
}

func (m *model) violate(kind, format string, args ...any) {
	m.r.violate(kind, format, args...)
	if m.cfg.StopOnViolation {
		m.stopOnce.Do(m.stop)
	}
}

// inject injects the backend's faults, one at a time, with pauses.
func (m *model) inject(rng *rand.Rand) {
	done := make([]int, len(m.b.Faults))
	// Each fault once first, in an order drawn from the seed; then any.
	first := rng.Perm(len(m.b.Faults))
	for n := 0; m.ctx.Err() == nil; n++ {
		sleep(m.ctx, time.Duration(150+rng.IntN(400))*time.Millisecond)
		if m.ctx.Err() != nil {
			return
		}
		i := rng.IntN(len(m.b.Faults))
		if n < len(first) {
			i = first[n]
		}
		f := m.b.Faults[i]
		if f.Limit > 0 && done[i] >= f.Limit {
			continue
		}
		done[i]++
		from := time.Now()
		var err error
		switch {
		case f.Lose != nil:
			err = m.lose(f, from)
		case f.Fail != nil:
			err = f.Fail(m.ctx, func() {
				m.dmu.Lock()
				m.lost = append(m.lost, time.Now())
				m.dmu.Unlock()
			})
		default:
			err = f.Inject(m.ctx)
		}
		to := time.Now()
		m.dmu.Lock()
		m.faults = append(m.faults, window{from, to})
		if f.LosesState {
			m.amnesia = append(m.amnesia, window{from, to})
		}
		m.dmu.Unlock()
		if err != nil && m.ctx.Err() == nil {
			m.r.count("faults failed: "+f.Name, 1)
			m.t.Logf("%s: fault %s: %v", m.b.Name, f.Name, err)
			continue
		}
		m.r.count("faults: "+f.Name, 1)
	}
}

// lose injects f's loss and records its excuse: only for the Locker that
// made the grant whose lease the server ended.
func (m *model) lose(f Fault, from time.Time) error {
	m.dmu.Lock()
	m.losing = true
	m.dmu.Unlock()
	defer m.judgeDeferred()
	l, err := f.Lose(m.ctx)
	revoked := time.Now()
	if err != nil || l.Holder == "" {
		if err == nil {
			m.r.count("losses that found the lock free", 1)
		}
		return err
	}
	m.dmu.Lock()
	defer m.dmu.Unlock()
	if l.ActorKnown {
		m.excuses = append(m.excuses, excuse{actor: l.Actor, from: from, revoked: revoked, until: revoked.Add(l.Bound)})
		return nil
	}
	for _, g := range m.grants {
		if g.holder == l.Holder {
			m.excuses = append(m.excuses, excuse{actor: g.actor, from: from, revoked: revoked, until: revoked.Add(l.Bound)})
			return nil
		}
	}
	// A grant whose reply has not come yet: its Locker is known once it
	// comes (granted).
	m.r.count("losses of a grant not yet returned", 1)
	if m.lossPending == nil {
		m.lossPending = map[string]excuse{}
	}
	m.lossPending[l.Holder] = excuse{from: from, revoked: revoked, until: revoked.Add(l.Bound)}
	return nil
}

// judgeDeferred judges, once a loss's excuse is recorded, the promises
// found not held while it was injected: the server may have ended the
// lease before the excuse was known.
func (m *model) judgeDeferred() {
	m.dmu.Lock()
	m.losing = false
	ds := m.deferred
	m.deferred = nil
	m.dmu.Unlock()
	for _, d := range ds {
		m.judgePromise(d.g, d.reply, d.bad, false)
	}
}

// judgePromise judges one promise observed at reply; bad says how the
// observation disagreed with it ("" when it agreed). A loss's window
// excuses the overlap between the server's end of the lease and its
// Locker's learning of it, for that Locker's grants made before the loss,
// and no more. While a loss is being injected, a disagreement waits for
// its excuse (judgeDeferred) when defer is set.
func (m *model) judgePromise(g *grant, reply time.Time, bad string, canDefer bool) {
	if bad != "" && canDefer {
		m.dmu.Lock()
		if m.losing {
			m.deferred = append(m.deferred, deferredPromise{g, reply, bad})
			m.dmu.Unlock()
			return
		}
		m.dmu.Unlock()
	}
	if m.lostBetween(g.start, reply) {
		// The server that granted it may have been lost since, with the
		// grant's write: the new one is not bound by it.
		m.r.count(FailoverJudged, 1)
		if bad != "" {
			m.r.count(FailoverExcused, 1)
			return
		}
	}
	in, past := m.excused(g, reply)
	if in {
		m.r.count(RevokeJudged, 1)
		if bad != "" {
			m.r.count(RevokeExcused, 1)
			return
		}
	} else if past {
		m.r.count(RevokePast, 1)
		if bad != "" {
			bad += " (its Locker's lease was ended on the server, past the bound of its detection)"
		}
	} else if bad != "" && m.anyLoss() {
		bad += " (no loss of its Locker's lease was injected after its grant was asked for)"
	}
	if bad != "" {
		m.violate(Promise, "%s", bad)
	}
}

// lostBetween reports whether a [Fault.Fail] stopped a server after from
// and before to: a grant asked for before it, or a release answered
// before it, may have been the lost server's alone.
func (m *model) lostBetween(from, to time.Time) bool {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for _, at := range m.lost {
		if from.Before(at) && at.Before(to) {
			return true
		}
	}
	return false
}

// anyLoss reports whether a loss's excuse was recorded in the run.
func (m *model) anyLoss() bool {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	return len(m.excuses) > 0
}

// excused reports whether g may be believed at at while the server has
// ended it (within a loss's window), and whether a loss's window of g's
// Locker ended before at.
func (m *model) excused(g *grant, at time.Time) (in, past bool) {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for _, e := range m.excuses {
		if e.actor != g.actor || !g.start.Before(e.revoked) || !e.from.Before(at) {
			continue
		}
		if at.After(e.until) {
			past = true
		} else {
			in = true
		}
	}
	return in, past
}

// faulted reports whether a fault was injected between from and to, or
// within a second before from (a renewal it delayed may land later).
func (m *model) faulted(from, to time.Time) bool {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for _, w := range m.faults {
		if w.from.Before(to) && w.to.Add(time.Second).After(from) {
			return true
		}
	}
	return false
}

// observe reads the resource once and judges every live promise against
// the read; it returns the observation, or nil when the read failed.
func (m *model) observe() *Observation {
	type promise struct {
		h     *held
		until time.Time // local monotonic moment the lease is promised until
	}
	m.mu.Lock()
	var ps []promise
	m.dmu.Lock()
	for h := range m.holds {
		t0 := time.Now()
		switch v := h.lease.Validity(); {
		case v > 0:
			ps = append(ps, promise{h, t0.Add(v)})
		case v == 0:
			delete(m.holds, h) // ended: it is promised nothing more
		}
	}
	m.dmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	sent := time.Now()
	o, err := m.b.Observe(ctx, m.cfg.Resource)
	reply := time.Now()
	cancel()
	m.mu.Unlock()
	if err != nil {
		m.r.count("observations failed", 1)
		return nil
	}
	m.r.count("observations", 1)
	m.dmu.Lock()
	m.obs = append(m.obs, observed{sent, reply, o})
	m.dmu.Unlock()
	m.judgeReleases(sent, o)
	if o.Holder == "" {
		for _, w := range o.Waiters {
			if w.Life > 0 {
				m.r.count(FreeWithWaiter, 1)
				break
			}
		}
	}
	for _, p := range ps {
		if !reply.Before(p.until.Add(-slack)) {
			continue // the promise may have run out by the reply
		}
		m.r.count(Promise, 1)
		m.dmu.Lock()
		p.h.g.judged = true
		m.dmu.Unlock()
		f := p.h.lease.Fence()
		left := p.until.Sub(reply)
		var bad string
		switch {
		case o.Holder == "":
			bad = fmt.Sprintf("%s lease %s (%s) not held, %v before the end of its validity", m.b.Name, f, p.h.g.kind, left)
		case o.Holder != f.Holder:
			bad = fmt.Sprintf("%s lease %s (%s) held by another holder %s with token %d, %v before the end of its validity",
				m.b.Name, f, p.h.g.kind, fence.HolderMark(o.Holder), o.Token, left)
		case o.Token != f.Token:
			bad = fmt.Sprintf("%s lease %s (%s) held with token %d, %v before the end of its validity", m.b.Name, f, p.h.g.kind, o.Token, left)
		case o.Left > 0:
			// The read came before its reply: the lease ends on the
			// server no later than the reply plus Left.
			m.r.count(PromiseEnd, 1)
			var drift time.Duration
			if m.b.Drift != nil {
				drift = m.b.Drift(p.h.g.ttl)
			}
			if over := left + drift - o.Left; over > slack {
				bad = fmt.Sprintf("%s lease %s (%s, ttl %v) believed for %v more (with a drift allowance of %v), the server holds it for %v at most: %v too long",
					m.b.Name, f, p.h.g.kind, p.h.g.ttl, left, drift, o.Left, over)
			}
		}
		m.judgePromise(p.h.g, reply, bad, true)
	}
	return &o
}

// granted records a grant and judges its token against every grant that
// returned before it was asked for, and every observation that returned
// before it was asked for.
func (m *model) granted(g *grant) {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	var floor fence.Token
	seen := false
	for _, o := range m.obs {
		if o.reply.Before(g.start) && o.o.Floor >= floor {
			floor, seen = o.o.Floor, true
		}
	}
	// Every pair is a judgment; a grant's violations are told once, with
	// the highest token it went below.
	var worst *grant
	for _, e := range m.grants {
		if !e.end.Before(g.start) {
			continue
		}
		if m.forgotBetween(e.end, g.start) {
			m.r.count(StateLossTokens, 1)
			if seen && e.token >= floor {
				m.r.count(StateLossExcused, 1)
				continue
			}
		}
		m.r.count(Tokens, 1)
		g.judged = true
		for _, at := range m.lost {
			if e.end.Before(at) && at.Before(g.start) {
				m.r.count(FailoverTokens, 1)
				break
			}
		}
		if e.token >= g.token && (worst == nil || e.token > worst.token) {
			worst = e
		}
	}
	if worst != nil {
		m.violate(Tokens, "%s grant of token %d (%s) was asked for after a grant of token %d (%s) returned", m.b.Name, g.token, g.kind, worst.token, worst.kind)
	}
	if seen {
		m.r.count(Anchor, 1)
		g.judged = true
		if g.token <= floor {
			m.violate(Anchor, "%s grant of token %d (%s) was asked for after an observation whose floor was %d", m.b.Name, g.token, g.kind, floor)
		}
	}
	m.grants = append(m.grants, g)
	m.r.count("grants: "+g.kind, 1)
}

// forgotBetween reports whether a fault that lost a node's data
// (Fault.LosesState) was under way between from and to. Called with dmu
// held.
func (m *model) forgotBetween(from, to time.Time) bool {
	for _, w := range m.amnesia {
		if w.from.Before(to) && w.to.After(from) {
			return true
		}
	}
	return false
}

// begin starts an actor's call.
func (m *model) begin(actor int, until time.Time) *call {
	c := &call{start: time.Now(), until: until}
	m.dmu.Lock()
	m.cur[actor] = c
	m.dmu.Unlock()
	return c
}

// end records how an actor's call ended.
func (m *model) end(c *call, f *fence.Fence, err error) {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	c.end = time.Now()
	c.done = true
	if f != nil {
		c.granted, c.token = true, f.Token
	}
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		c.gaveUp = true
	}
}

func (m *model) register(h *held) {
	m.dmu.Lock()
	m.holds[h] = struct{}{}
	m.dmu.Unlock()
}

func (m *model) unregister(h *held) {
	m.dmu.Lock()
	delete(m.holds, h)
	m.dmu.Unlock()
}

// othersHeld reports whether a lease other than h is promised now.
func (m *model) othersHeld(h *held) bool {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for o := range m.holds {
		if o != h && o.lease.Validity() > 0 {
			return true
		}
	}
	return false
}

// anotherHolding returns another registered lease believed valid, or nil.
func (m *model) anotherHolding(h *held) *held {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	for o := range m.holds {
		if o != h && o.lease.Validity() > 0 {
			return o
		}
	}
	return nil
}

// stillHolding reports whether o is registered (its release not begun)
// and believed valid.
func (m *model) stillHolding(o *held) bool {
	m.dmu.Lock()
	defer m.dmu.Unlock()
	_, ok := m.holds[o]
	return ok && o.lease.Validity() > 0
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
