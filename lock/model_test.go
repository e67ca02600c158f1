package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// A randomized model of the lock. Several Lockers drive one resource with
// short leases (TryAcquire, Acquire with give-ups, Owner re-entry, Extend,
// Release, AutoRenew, TTL, Advance, FenceLock, polling with WithWait) while
// a watcher reads the lock key on every node as Redis sees it: its value,
// its absolute expiry (PEXPIRETIME) and the server clock, in one script.
// The checks:
//
//   - promise: a lease whose Validity is v at local time t is promised held
//     until t+v. Whenever the watcher finds the key gone, held by another
//     holder, or set to expire before that moment, while the moment is
//     provably still ahead on the server's clock, the promise was broken:
//     the lease believes it holds the lock after Redis let it go, and
//     another holder can have it meanwhile (their Redis-held intervals
//     overlap). Under Redlock the promise is a quorum's, and it includes
//     the drift allowance: a quorum holds the key until t+v+drift. A node
//     that granted the lease and then lost its data (killed, restarted
//     empty) is excused from it; no other node is.
//   - tokens: a grant that returned before another was asked for has the
//     lower token, unless they are holds of one grant (Owner). Under Redlock
//     a pair is excused only when a node that granted the earlier lease
//     lost its data in between and the earlier token was ahead of the
//     clock, which is all the later grant's nodes can still go by.
//   - anchor: a grant's token is not below the server's clock when it was
//     asked for (tokens are max(counter+1, clock)), which is what keeps
//     them rising across a node's data loss.
//   - quorum (Redlock): the nodes that replied with a grant to the lease's
//     holder are a quorum, and a quorum of them issued the lease's token or
//     confirmed its raise to it.
//   - queue: a waiter whose queue entry was live and ahead of a grant's
//     asker when that grant was made, and still waiting (its Acquire's
//     deadline not reached), is served first; it may leave after, but it
//     may not be served after the grant, or never.
//   - renewal: a lease with AutoRenew that its actor holds past its first
//     validity is still held; a few lapse on a loaded machine, most may not.
//     A lease that starts with under two thirds of its ttl left (the
//     workload holds back some grants' replies) is renewed at once: its
//     first renewal is sent within a sixth of its ttl of the reply, for
//     most such leases (renewal is scheduled from what is left, DESIGN 4c).
//   - FenceLock: one foreign grant, one token; a later grant, a higher one.
//
// The workload makes the states in which these checks decide, and counts
// them: queued waiters pause now and then before a try (pauseHook), so the
// lock is left free at a lease's end with a live waiter queued, which every
// other try must respect ("free-lock tries", also on the try's fast path);
// holders overrun their lease and release late, after trying again at its
// end (releaseLate), so that a release meets the lock in another holder's
// hands, and the promises are checked right after such a release. That
// state is too rare in a short run to require, so a scenario beside the
// random workload makes it on purpose, on a resource of its own, on each of
// the release's paths: nobody queued (the fast path) and a waiter queued
// (model_late_test.go; "late releases judged: ..."). Another scenario, on
// a resource of its own too, loses a release's request, and a try's reply
// with its cleanup's request, and judges that the grant nobody alive holds
// is gone within a bound (model_lost_test.go; "lost replies judged: ...").
//
// Every check counts what it judged, by kind, and a run that judged fewer
// than its floor of a kind fails (see modelFloors), as does one that read
// too many replies of no shape it knows.
//
// Soundness on a loaded machine: nothing is judged from a sleep or a
// timeout. Every comparison is between Redis's own expiry times and a
// lower bound of the promised moment on the server's clock: the server's
// clock offset is bounded from below by every observation (the server's
// TIME minus the local clock after the reply), so scheduling delays only
// make a check inconclusive, never wrong. Calls that legitimately end or
// shorten a promise (Release, Extend) run under the model's lock, which the
// watcher holds from reading Validity to the observation's reply. The only
// judgments by rate are the renewal's: a loaded machine runs some renewals
// late, so each renewal check fails a run only when most judged leases had
// none in time.
//
// FENCEKIT_CHECK_SEED replays a run's schedule (each actor draws its steps
// from the seed; goroutine interleavings still differ), FENCEKIT_CHECK_TIME
// sets each run's budget (default 3s), FENCEKIT_CHECK_ALL=1 prints every
// violation rather than a few of each kind.

// modelSlack is the clock-rate allowance of the promise check, far above
// the drift between the local and the server's clock over one lease.
const modelSlack = 250 * time.Microsecond

// modelQueueLife is how long a waiter's queue entry lives without a
// refresh (the lock package's queueLife).
const modelQueueLife = 3 * time.Second

func modelBudget(t *testing.T) time.Duration {
	if s := os.Getenv("FENCEKIT_CHECK_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("FENCEKIT_CHECK_TIME=%q: %v", s, err)
		}
		return d
	}
	return 3 * time.Second
}

func modelSeed(t *testing.T) uint64 {
	if s := os.Getenv("FENCEKIT_CHECK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FENCEKIT_CHECK_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// modelLease is what the model needs of a lease; the negative control
// wraps *lock.Lease to break it.
type modelLease interface {
	Fence() fence.Fence
	Validity() time.Duration
	Err() error
	Extend(ctx context.Context, ttl time.Duration) error
	Release(ctx context.Context) error
	TTL(ctx context.Context) (time.Duration, error)
}

// grant is one lease handed to an actor.
type grant struct {
	f          fence.Fence
	kind       string // "try", "acquire" (queued), "poll", "reentry"
	opts       string // "+owner", "+renew"
	ttl        time.Duration
	start, end time.Time
	epochs     []int64 // node kill counts before the call (Redlock)
	actor      int
	// nodes are the Redlock nodes whose acquire replied with a grant to
	// this lease's holder, as the actor's clients saw.
	nodes []int
}

// held is a lease the watcher checks.
type held struct {
	l     modelLease
	g     *grant
	owner bool
	// ext is the ttl of the hold's last Extend that succeeded, extFailed
	// of the last one that failed; extMin the shortest that succeeded.
	ext, extFailed, extMin atomic.Int64
	// renew says the lease renews itself (AutoRenew, or the model's broken
	// renewal); stop ends the model's renewal.
	renew bool
	stop  chan struct{}
	// excused says a node's data loss excused part of its promise once.
	excused atomic.Bool
	// checked says a promise check of it was conclusive once.
	checked atomic.Bool
	// extending says its actor's Extend is under way: an extension sent
	// meanwhile may be that Extend's rather than a renewal.
	extending atomic.Bool
	// timely says a renewal was sent with a sixth of the lease or more left.
	timely atomic.Bool
	// startLeft is the lease's validity when it was registered.
	startLeft time.Duration
	// short is, for a lease made to start short (its grant's reply held
	// back), when its grant was sent and its reply came.
	short *slowGrant
	// key is the lock key the promise is judged against, when it is not
	// the model's resource's (the late-release scenario's, see
	// model_late_test.go).
	key string
}

type modelNode struct {
	c     *redis.Client // the watcher's own client
	srv   *testenv.RedisServer
	down  atomic.Bool
	flaky atomic.Bool  // Redlock: the actors' clients lose commands to it
	lost  atomic.Int64 // commands lost
	kill  atomic.Int64 // kills so far
	// offset is a lower bound of (server clock - local clock), in µs, once
	// observed says an observation has set it.
	offset   atomic.Int64
	observed atomic.Bool
}

type model struct {
	t *testing.T
	// trace holds each Redlock lease's grant and extensions, by holder
	// id, to explain a broken promise.
	trace    map[string][]string
	traceMu  *sync.Mutex
	seed     uint64
	resource string
	prefix   string
	nodes    []*modelNode
	quorum   int
	redlock  bool
	wrap     func(m *model, l *lock.Lease, ttl time.Duration) modelLease
	plain    bool
	cfg      modelConfig

	mu    sync.RWMutex // read: an observation; write: a call that ends or shortens a promise
	holds map[*held]struct{}

	gmu     sync.Mutex
	grants  []*grant
	foreign []*grant
	queue   map[string]*queued
	served  map[string]fence.Token // a holder's first grant, as published or returned
	// registered holds every holder a grant was registered for: a later
	// grant to one of them is a re-entry of that grant.
	registered map[string]bool
	// reentered holds every holder whose grant an Owner's call re-entered,
	// as the actors' clients saw the replies.
	reentered map[string]bool
	// trySent is when each holder's try.lua call was sent, as its client
	// saw: the queue judge counts a try's place from then, not from when
	// TryAcquire was called.
	trySent map[string]time.Time
	// tryReplied is when each holder's latest try.lua call was answered:
	// a grant it made was made before then.
	tryReplied map[string]time.Time
	// jumped holds every holder whose grant the queue control took past a
	// waiter provably ahead; it counts as exposed once the grant is a lease.
	jumped map[string]bool
	// nodeGrants and raised are, by holder, the Redlock nodes whose
	// acquire replied with a grant (and its token), and those that
	// confirmed a raise to a token, as the actors' clients saw.
	nodeGrants map[string]map[int]int64
	raised     map[string]map[int]int64
	chanGap    atomic.Bool
	ran        time.Duration // how long the actors ran
	// exposed counts what a broken variant did wrong so far (a control's
	// run goes on until it has done enough).
	exposed  atomic.Int64
	vmu      sync.Mutex
	viol     []string
	seen     map[string]bool
	stats    map[string]*atomic.Int64
	statsMu  sync.Mutex
	notes    []string   // the first few unparsed replies, to show
	rmu      sync.Mutex // nodeGrants, raised
	renewMu  sync.Mutex
	renewing map[string]*held // self-renewing holds without Owner, by holder
	// earlyRenewal holds the holders whose lease had a renewal sent
	// before the lease was registered.
	earlyRenewal map[string]bool
	renewals     []float64 // each renewal's validity left when sent, as a share of its ttl
	// firstRenewal is, by holder, when the first extension other than an
	// actor's Extend was sent.
	firstRenewal map[string]time.Time
	shortDelays  []float64 // each judged short start's first renewal after its reply, as a share of its ttl
	deadline     time.Time
}

func (m *model) count(name string, n int64) {
	m.statsMu.Lock()
	c := m.stats[name]
	if c == nil {
		c = new(atomic.Int64)
		m.stats[name] = c
	}
	m.statsMu.Unlock()
	c.Add(n)
}

// note keeps the first few examples of something the model could not
// read, for the report.
func (m *model) note(format string, args ...any) {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	if len(m.notes) < 5 {
		m.notes = append(m.notes, fmt.Sprintf(format, args...))
	}
}

// violation records a broken rule once per subject (a lease, a pair of
// grants); repeats of it only count.
func (m *model) violation(kind string, subject any, format string, args ...any) {
	m.vmu.Lock()
	defer m.vmu.Unlock()
	k := fmt.Sprintf("%s %v", kind, subject)
	if m.seen[k] {
		m.count("violations repeated", 1)
		return
	}
	m.seen[k] = true
	m.viol = append(m.viol, kind+": "+fmt.Sprintf(format, args...))
}

// stat returns a count's value so far.
func (m *model) stat(name string) int64 {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	if c := m.stats[name]; c != nil {
		return c.Load()
	}
	return 0
}

func (m *model) violations(kind string) int {
	m.vmu.Lock()
	defer m.vmu.Unlock()
	n := 0
	for _, v := range m.viol {
		if strings.HasPrefix(v, kind+":") {
			n++
		}
	}
	return n
}

func (m *model) epochs() []int64 {
	e := make([]int64, len(m.nodes))
	for i, n := range m.nodes {
		e[i] = n.kill.Load()
	}
	return e
}

// observeScript reads the lock key as Redis sees it: its value (false when
// there is none), its absolute expiry in ms (-1: none, -2: no key) and the
// server clock.
var observeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local e = redis.call('PEXPIRETIME', KEYS[1])
local t = redis.call('TIME')
return {v, e, t[1], t[2]}`)

// observation is one node's view: the key's value and the last server
// moment (µs) at which it still holds it, or srv when it is not held.
type observation struct {
	ok     bool
	value  string
	until  int64 // µs, server clock: the key is held by value until then (inclusive bound)
	srv    int64 // µs, server clock at the observation
	offset int64 // lower bound of server-local offset after this observation
}

func (m *model) observe(ctx context.Context, n *modelNode, key string) observation {
	raw, err := observeScript.Run(ctx, n.c, []string{key}).Slice()
	t1 := time.Now()
	if err != nil || len(raw) != 4 {
		return observation{}
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(raw[2]), 10, 64)
	usec, _ := strconv.ParseInt(fmt.Sprint(raw[3]), 10, 64)
	srv := sec*1_000_000 + usec
	// TIME ran before t1 on the local clock.
	low := srv - t1.UnixMicro()
	for {
		cur := n.offset.Load()
		if low <= cur || n.offset.CompareAndSwap(cur, low) {
			break
		}
	}
	n.observed.Store(true)
	o := observation{ok: true, srv: srv, offset: n.offset.Load()}
	if v, isStr := raw[0].(string); isStr {
		o.value = v
		exp, _ := raw[1].(int64)
		switch {
		case exp == -1:
			o.until = 1 << 62
		default:
			// Redis keeps a key while its millisecond clock is at or below
			// the expiry: until the expiry's millisecond has passed.
			o.until = (exp + 1) * 1000
		}
	} else {
		o.until = srv
	}
	return o
}

// watch observes the key until ctx ends and checks every live promise.
func (m *model) watch(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		m.checkPromises(ctx, nil)
		time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
	}
}

// checkPromises observes the key once and checks every live promise
// against it; it returns the first node's observation, how many promises
// it checked, and the verdict on focus's promise (verdictNone when focus
// is nil or had none). A hold on another resource's lock (held.key) is
// judged against that key, observed in the same pass.
func (m *model) checkPromises(ctx context.Context, focus *held) (observation, int, verdict) {
	key := m.prefix + "{" + m.resource + "}:lock"
	m.mu.RLock()
	type promise struct {
		h *held
		d time.Time // promised moment, local wall clock, a lower bound
	}
	var ps []promise
	for h := range m.holds {
		t0 := time.Now()
		if v := h.l.Validity(); v > 0 {
			ps = append(ps, promise{h, t0.Add(v)})
		} else if v < 0 {
			m.count("promises untracked (Owner without AutoRenew)", 1)
		}
	}
	obs := make([]observation, len(m.nodes))
	for i, n := range m.nodes {
		if !n.down.Load() {
			obs[i] = m.observe(ctx, n, key)
		}
	}
	// Holds on other keys exist only in the single-node model.
	other := map[string][]observation{}
	for _, p := range ps {
		if k := p.h.key; k != "" && other[k] == nil {
			other[k] = []observation{m.observe(ctx, m.nodes[0], k)}
		}
	}
	m.mu.RUnlock()
	m.count("observations", 1)
	v := verdictNone
	for _, p := range ps {
		o := obs
		if p.h.key != "" {
			o = other[p.h.key]
		}
		if r := m.judge(p.h, p.d, o); p.h == focus {
			v = r
		}
	}
	return obs[0], len(ps), v
}

// verdict is the promise check's outcome for one promise.
type verdict int

const (
	verdictNone         verdict = iota // no promise checked
	verdictInconclusive                // the promised moment may have passed already
	verdictKept
	verdictBroken
)

// judge checks one promise against the nodes' observations.
func (m *model) judge(h *held, d time.Time, obs []observation) verdict {
	holder := h.l.Fence().Holder
	failed, conclusive := 0, 0
	var why []string
	// Under Redlock a quorum holds the key for the drift allowance past
	// the validity: the validity is what a quorum holds less the drift of
	// the lease it counted, never less than that of the shortest ttl the
	// lease was granted or extended with.
	var drift int64
	if m.redlock {
		x := h.g.ttl
		if e := time.Duration(h.extMin.Load()); e > 0 && e < x {
			x = e
		}
		drift = lockmodel.RedlockDrift(x).Microseconds()
	}
	for i, o := range obs {
		if m.redlock && m.nodes[i].kill.Load() != h.g.epochs[i] && slices.Contains(h.g.nodes, i) {
			// This node granted the lease and lost its data since: what it
			// holds now says nothing about the promise. Other nodes are
			// still judged.
			m.count("promise node checks excused (the node granted it and lost its data)", 1)
			if h.excused.CompareAndSwap(false, true) {
				m.count("promises excused in part (a granting node lost its data)", 1)
			}
			continue
		}
		if !o.ok {
			if m.redlock && m.nodes[i].down.Load() {
				failed++ // down since before the grant: never held it
				why = append(why, fmt.Sprintf("node %d down", i))
			}
			continue
		}
		// The promised moment on the server's clock is at least this.
		dSrv := d.UnixMicro() + o.offset - modelSlack.Microseconds()
		if o.srv >= dSrv {
			continue // the promise may have run out already
		}
		conclusive++
		if o.value != holder || o.until < dSrv+drift {
			failed++
			switch {
			case o.value == "":
				why = append(why, fmt.Sprintf("node %d: not held, %.3fms before the promised moment", i, float64(dSrv-o.srv)/1000))
			case o.value != holder:
				why = append(why, fmt.Sprintf("node %d: held by another holder %s, %.3fms before the promised moment", i, fence.HolderMark(o.value), float64(dSrv-o.srv)/1000))
			case o.until >= dSrv:
				why = append(why, fmt.Sprintf("node %d: expires %.3fms after the promised moment, within the drift allowance of %.3fms", i, float64(o.until-dSrv)/1000, float64(drift)/1000))
			default:
				why = append(why, fmt.Sprintf("node %d: expires %.3fms before the promised moment", i, float64(dSrv-o.until)/1000))
			}
		}
	}
	if conclusive == 0 {
		m.count("promise checks inconclusive", 1)
		return verdictInconclusive
	}
	m.count("promise checks", 1)
	if m.cfg.exposeOnCheck && h.checked.CompareAndSwap(false, true) {
		m.exposed.Add(1) // a broken lease the judge has seen
	}
	allowed := len(m.nodes) - m.quorum
	if failed <= allowed {
		return verdictKept
	}
	ext := ""
	if e := h.ext.Load(); e > 0 {
		ext = fmt.Sprintf(", last extended to %v", time.Duration(e))
	}
	if e := h.extFailed.Load(); e > 0 {
		ext += fmt.Sprintf(", an Extend to %v failed", time.Duration(e))
	}
	trace := ""
	if m.traceMu != nil {
		m.traceMu.Lock()
		trace = "\n\t" + strings.Join(m.trace[holder], "\n\t")
		m.traceMu.Unlock()
	}
	m.violation("promise", fmt.Sprintf("%p", h), "%s%s lease token %d (ttl %v%s, %s, actor %d) told valid until %s, Redis let it go: %s%s",
		h.g.kind, h.g.opts, h.g.f.Token, h.g.ttl, ext, fence.HolderMark(holder), h.g.actor, d.Format("15:04:05.000000"), strings.Join(why, "; "), trace)
	return verdictBroken
}

// clockFloor is the lowest token the server clock alone guarantees a grant
// asked for at start: every node's token is at least its clock when it
// ran the grant, which is after start. ok is false while a node's clock
// offset is not known from an observation yet.
func (m *model) clockFloor(start time.Time) (floor int64, ok bool) {
	off := int64(1 << 62)
	for _, n := range m.nodes {
		if !n.observed.Load() {
			return 0, false
		}
		off = min(off, n.offset.Load())
	}
	return start.UnixMicro() + off - modelSlack.Microseconds(), true
}

// granted records a grant and checks its token: against the clock, and
// against every grant that returned before it was asked for; under Redlock
// also its quorum.
func (m *model) granted(g *grant) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if (m.registered[g.f.Holder] || m.reentered[g.f.Holder]) && g.kind != "reentry" {
		// An Owner's call that found its own lock: a re-entry of a grant
		// made earlier (one registered, or one handed to an Owner's
		// waiter that gave up), not a grant.
		g.kind = "reentry"
	}
	m.registered[g.f.Holder] = true
	if m.jumped[g.f.Holder] && g.kind != "reentry" {
		delete(m.jumped, g.f.Holder)
		m.exposed.Add(1) // the queue control's jump became a lease the judge sees
	}
	if old, ok := m.served[g.f.Holder]; !ok || g.f.Token < old {
		m.served[g.f.Holder] = g.f.Token
	}
	m.count("grants "+g.kind, 1)
	if m.redlock {
		m.checkQuorum(g)
	}
	floor, known := m.clockFloor(g.start)
	if g.kind != "reentry" {
		switch {
		case !known:
			m.count("token anchor checks inconclusive", 1)
		case int64(g.f.Token) < floor:
			m.violation("anchor", fmt.Sprintf("%p", g), "%s grant token %d (actor %d) is %.3fms below the server clock when it was asked for",
				g.kind, g.f.Token, g.actor, float64(floor-int64(g.f.Token))/1000)
		default:
			m.count("token anchor checks", 1)
		}
	}
	for _, a := range m.grants {
		if a.f.Holder == g.f.Holder || !a.end.Before(g.start) {
			continue
		}
		if m.redlock && known && int64(a.f.Token) >= floor && m.lostSince(a) {
			// A node that granted a lost its data, and a's token was ahead
			// of the clock: the later quorum may not hold state at it.
			m.count("token pairs excused (a granting node lost its data)", 1)
			continue
		}
		m.count("token pairs checked", 1)
		if a.f.Token >= g.f.Token {
			m.violation("token", fmt.Sprintf("%p %p", a, g), "%s grant token %d (actor %d) asked for after %s grant token %d (actor %d) had returned",
				g.kind, g.f.Token, g.actor, a.kind, a.f.Token, a.actor)
		}
	}
	m.grants = append(m.grants, g)
}

// lostSince reports whether a node that granted a has been killed since a
// was asked for.
func (m *model) lostSince(a *grant) bool {
	for _, i := range a.nodes {
		if m.nodes[i].kill.Load() != a.epochs[i] {
			return true
		}
	}
	return false
}

// checkQuorum judges a Redlock grant by what its nodes replied: a quorum
// granted it, and a quorum holds token state at its token (issued it, or
// confirmed the raise to it).
func (m *model) checkQuorum(g *grant) {
	atToken := 0
	m.rmu.Lock()
	raised := m.raised[g.f.Holder]
	for i, tok := range m.nodeGrants[g.f.Holder] {
		g.nodes = append(g.nodes, i)
		if tok == int64(g.f.Token) || raised[i] >= int64(g.f.Token) {
			atToken++
		}
	}
	m.rmu.Unlock()
	slices.Sort(g.nodes)
	m.count("Redlock quorums checked", 1)
	switch {
	case len(g.nodes) < m.quorum:
		m.violation("quorum", fmt.Sprintf("%p", g), "%s lease token %d (actor %d) handed out with grants from nodes %v only, %d needed",
			g.kind, g.f.Token, g.actor, g.nodes, m.quorum)
	case atToken < m.quorum:
		m.violation("quorum", fmt.Sprintf("%p", g), "%s lease token %d (actor %d) handed out with token state at its token on %d nodes (grants from %v), %d needed",
			g.kind, g.f.Token, g.actor, atToken, g.nodes, m.quorum)
	}
}

// listen records every grant a release publishes.
func (m *model) listen(ctx context.Context, ps *redis.PubSub) {
	for {
		msg, err := ps.ReceiveTimeout(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.chanGap.Store(true)
			continue
		}
		mm, ok := msg.(*redis.Message)
		if !ok {
			continue
		}
		if mm.Payload == "" {
			m.count("wake-ups published (the lock is free)", 1)
			continue
		}
		if isQueueAnnouncement(mm.Payload) {
			m.count("queue announcements published", 1)
			continue
		}
		// "<holder> <token> <refreshed µs> <age ms>": a grant to a waiter.
		parts := strings.Fields(mm.Payload)
		var tok int64
		if len(parts) == 4 {
			tok, err = strconv.ParseInt(parts[1], 10, 64)
		}
		if len(parts) != 4 || err != nil {
			m.count("unparsed: release messages", 1)
			m.note("a release message of no known shape: %q", mm.Payload)
			continue
		}
		m.gmu.Lock()
		if old, ok := m.served[parts[0]]; !ok || fence.Token(tok) < old {
			m.served[parts[0]] = fence.Token(tok)
		}
		m.gmu.Unlock()
		m.count("hand-overs published", 1)
	}
}

// isQueueAnnouncement reports whether a release message tells the first
// waiters where they stand: "q:<remaining ms>:<first>[:<second>[:<third>]]",
// with the tail ": 1 0 0" that earlier readers take for a grant to nobody.
func isQueueAnnouncement(msg string) bool {
	msg, ok := strings.CutSuffix(msg, ": 1 0 0")
	if !ok {
		return false
	}
	parts := strings.Split(msg, ":")
	if len(parts) < 3 || len(parts) > 5 || parts[0] != "q" {
		return false
	}
	if ms, err := strconv.ParseInt(parts[1], 10, 64); err != nil || ms < -2 {
		return false
	}
	for _, h := range parts[2:] {
		if h == "" || strings.ContainsAny(h, " ") {
			return false
		}
	}
	return true
}

// actor is one Locker's sequence of calls.
type actor struct {
	m      *model
	id     int
	l      *lock.Locker
	kind   string // "acquire" or "poll": how its Acquire waits
	rng    *rand.Rand
	owner  string
	direct *redis.Client // for FenceLock's foreign lock
	// fresh makes every Acquire use a new Locker of its own.
	fresh     bool
	newLocker func() *lock.Locker
}

func (a *actor) ttl() time.Duration {
	// Some with a fraction of a millisecond, which Redis never gets.
	ms := []float64{25, 40.97, 60, 90.5, 150, 250.99}[a.rng.IntN(6)]
	if a.m.plain {
		ms = float64(int(ms))
	}
	if a.m.redlock {
		ms += 60 // above drift and node timeouts
	}
	if a.m.cfg.longLeases {
		ms *= 4
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func (a *actor) acquireOpts() ([]lock.AcquireOption, string) {
	var opts []lock.AcquireOption
	names := ""
	if !a.m.redlock && !a.m.plain && a.rng.IntN(3) == 0 {
		opts = append(opts, lock.Owner(a.owner))
		names += "+owner"
	}
	if a.rng.IntN(3) == 0 {
		if !a.m.cfg.renewAtEnd && !a.m.cfg.renewNominal {
			opts = append(opts, lock.AutoRenew())
		}
		names += "+renew"
	}
	return opts, names
}

func (a *actor) register(l *lock.Lease, kind string, ttl time.Duration, start time.Time, epochs []int64, opts string) *held {
	g := &grant{f: l.Fence(), kind: kind, opts: opts, ttl: ttl, start: start, end: time.Now(), epochs: epochs, actor: a.id}
	ml := a.m.wrap(a.m, l, ttl)
	g.f = ml.Fence()
	h := &held{l: ml, g: g, owner: strings.Contains(opts, "+owner"), renew: strings.Contains(opts, "+renew"), startLeft: l.Validity()}
	a.m.granted(g)
	switch {
	case h.renew && a.m.cfg.renewAtEnd:
		h.stop = make(chan struct{})
		go renewAtEnd(l, ttl, h.stop)
	case h.renew && a.m.cfg.renewNominal:
		h.stop = make(chan struct{})
		go renewNominal(l, ttl, h.stop)
	}
	a.m.mu.Lock()
	a.m.holds[h] = struct{}{}
	a.m.mu.Unlock()
	if h.renew && !h.owner {
		a.m.renewMu.Lock()
		a.m.renewing[g.f.Holder] = h
		a.m.renewMu.Unlock()
	}
	return h
}

// renewAtEnd is the renewal control's broken renewal: it extends the lease
// when its validity has run out, rather than while a third of it is left.
func renewAtEnd(l *lock.Lease, ttl time.Duration, stop <-chan struct{}) {
	for {
		v := l.Validity()
		if v <= 0 {
			return
		}
		t := time.NewTimer(v)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.Extend(ctx, ttl)
		cancel()
	}
}

// release gives a hold up, withdrawing its promise first.
func (a *actor) release(h *held) {
	a.m.judgeRenewal(h)
	if h.stop != nil {
		close(h.stop)
	}
	a.m.mu.Lock()
	delete(a.m.holds, h)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = h.l.Release(ctx)
	cancel()
	a.m.mu.Unlock()
	a.m.count("steps", 1)
}

// releaseLate holds h past its lease's end, as a holder that paused would,
// and then releases it, sometimes after taking the lock again first (as a
// retry loop that acquires before it cleans up would). Its lease ran out
// meanwhile, and the lock is free (and the first queued waiter's to take:
// the try must leave it to that one) or another holder's (the release must
// leave it to that one, also on its fast path, which a release takes when
// nobody is queued). Right after the release the model checks every live
// promise, so a release that freed another holder's lock is seen before
// that lock is taken again. It returns the hold its try got, if any.
func (a *actor) releaseLate(ctx context.Context, h *held) *held {
	var again *held
	if a.rng.IntN(3) != 0 {
		// Tries as soon as its lease has run out: the lock is free then,
		// and the first queued waiter's to take, unless that one has
		// already tried.
		a.sleep(max(h.l.Validity(), 0) + time.Duration(a.rng.IntN(10))*time.Millisecond)
		if ctx.Err() == nil {
			ttl, start := a.ttl(), time.Now()
			if l, err := a.l.TryAcquire(ctx, a.m.resource, ttl); err == nil {
				again = a.register(l, "try", ttl, start, nil, "")
			}
			a.m.count("steps", 1)
		}
	}
	if again == nil {
		a.sleep(max(h.l.Validity(), 0) + time.Duration(a.rng.Int64N(int64(h.g.ttl/4)+1)))
	}
	a.release(h)
	if h.l.Validity() > 0 {
		return again // the sleep was cut short at the run's end
	}
	a.m.count("late releases", 1)
	o, n, _ := a.m.checkPromises(context.Background(), nil)
	if o.ok && o.value != "" && o.value != h.g.f.Holder && n > 0 {
		a.m.count("late releases judged: the lock in other hands", 1)
		queue := a.m.prefix + "{" + a.m.resource + "}:queue"
		if q, err := a.m.nodes[0].c.Exists(context.Background(), queue).Result(); err == nil && q == 0 {
			a.m.count("late releases judged: the lock in other hands, nobody queued", 1)
		}
	}
	return again
}

// extend extends a hold; Extend never shortens a lock, so the hold's
// promise can only grow.
func (a *actor) extend(h *held, ttl time.Duration) {
	h.extending.Store(true)
	defer h.extending.Store(false)
	a.m.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if h.l.Extend(ctx, ttl) == nil {
		h.ext.Store(int64(ttl))
		if e := h.extMin.Load(); e == 0 || int64(ttl) < e {
			h.extMin.Store(int64(ttl))
		}
	} else {
		h.extFailed.Store(int64(ttl))
	}
	cancel()
	a.m.mu.Unlock()
	a.m.count("steps", 1)
}

func (a *actor) sleep(d time.Duration) {
	if rem := time.Until(a.m.deadline); d > rem {
		d = max(rem, 0)
	}
	time.Sleep(d)
}

func (a *actor) run(ctx context.Context) {
	var cur *held
	defer func() {
		if cur != nil {
			a.release(cur)
		}
	}()
	for ctx.Err() == nil {
		if cur == nil {
			cur = a.take(ctx)
			continue
		}
		switch r := a.rng.IntN(100); {
		case r < 25: // hold, sometimes past the lease
			a.sleep(time.Duration(a.rng.Int64N(int64(a.ttl()*5/4) + 1)))
			a.m.count("steps", 1)
		case r < 45 && !a.m.plain && (!cur.renew || r < 30) && cur.short == nil:
			// A self-renewing lease is extended less often, so that the
			// renewal check has leases whose expiry only renewal moved.
			a.extend(cur, a.ttl())
		case r < 60 && cur.owner:
			a.reenter(ctx, cur)
		case r < 70:
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			_, _ = cur.l.TTL(tctx)
			cancel()
			a.m.count("steps", 1)
		case r < 80 && !cur.renew && !cur.owner && !a.m.redlock:
			cur = a.releaseLate(ctx, cur)
		default:
			a.release(cur)
			cur = nil
		}
	}
}

// take makes one attempt to get the lock, or does something else that
// needs no hold.
func (a *actor) take(ctx context.Context) *held {
	a.m.count("steps", 1)
	opts, names := a.acquireOpts()
	ttl := a.ttl()
	start, epochs := time.Now(), a.m.epochs()
	if !a.m.redlock && !a.fresh && a.rng.IntN(3) == 0 {
		return a.takeShort(ctx)
	}
	switch r := a.rng.IntN(100); {
	case r < 35:
		l, err := a.l.TryAcquire(ctx, a.m.resource, ttl, opts...)
		if err == nil {
			return a.register(l, "try", ttl, start, epochs, names)
		}
		a.sleep(time.Duration(a.rng.IntN(20)) * time.Millisecond)
	case r < 85:
		gctx, cancel := context.WithTimeout(ctx, time.Duration(10+a.rng.IntN(600))*time.Millisecond)
		locker := a.l
		if a.fresh {
			// A newcomer: a Locker with no subscription yet, as in a
			// process that starts.
			locker = a.newLocker()
			defer locker.Close()
			// Its Locker closes when this call returns, which stops the
			// lease's renewal: the renewal check passes it over.
			names += "+closed"
		}
		if strings.Contains(names, "+renew") {
			// A self-renewing lease's renewal is judged only when it
			// starts with half its ttl left: a pause of its waiter would
			// date the lease handed to it earlier still.
			gctx = context.WithValue(gctx, noPauseKey{}, true)
		}
		l, err := locker.Acquire(gctx, a.m.resource, ttl, opts...)
		cancel()
		if err == nil {
			return a.register(l, a.kind, ttl, start, epochs, names)
		}
		a.m.count("acquires given up", 1)
	case r < 92:
		// Token state written ahead (a clock ahead, or an Advance after a
		// stale refusal): later tokens only go up. Mostly by little, so
		// that the clock soon passes the counter again and tries take
		// their fast path (try_fast.lua, which grants only over a counter
		// behind the clock) most of the time; now and then by seconds.
		by := a.rng.IntN(50_000)
		if a.rng.IntN(10) == 0 {
			by = a.rng.IntN(2_000_000)
		}
		ahead := fence.Token(time.Now().UnixMicro() + int64(by))
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_ = a.l.Advance(actx, a.m.resource, ahead)
		cancel()
	default:
		if !a.m.redlock {
			a.fenceForeign(ctx)
		}
	}
	return nil
}

// reenter takes an inner hold of the owner's lock, uses it and releases it.
func (a *actor) reenter(ctx context.Context, outer *held) {
	opts, names := []lock.AcquireOption{lock.Owner(a.owner)}, "+owner"
	if a.rng.IntN(3) == 0 {
		opts = append(opts, lock.AutoRenew())
		names += "+renew"
	}
	start, ttl := time.Now(), a.ttl()
	l, err := a.l.TryAcquire(ctx, a.m.resource, ttl, opts...)
	a.m.count("steps", 1)
	if err != nil {
		return
	}
	kind := "reentry"
	if l.Fence().Holder != outer.l.Fence().Holder {
		kind = "try" // the outer hold had run out: a grant afresh
	}
	inner := a.register(l, kind, ttl, start, nil, names)
	for ctx.Err() == nil && a.rng.IntN(3) != 0 {
		if a.rng.IntN(2) == 0 {
			a.extend(inner, a.ttl())
		} else {
			a.sleep(time.Duration(a.rng.IntN(30)) * time.Millisecond)
		}
	}
	a.release(inner)
}

// fenceForeign takes a lock as another library would and fences it.
func (a *actor) fenceForeign(ctx context.Context) {
	key := a.m.prefix + "foreign"
	value := fence.NewHolder()
	start := time.Now()
	ok, err := a.direct.SetNX(ctx, key, value, a.ttl()).Result()
	if err != nil || !ok {
		return
	}
	f1, err1 := a.l.FenceLock(ctx, key, value)
	f2, err2 := a.l.FenceLock(ctx, key, value)
	end := time.Now()
	a.direct.Del(context.WithoutCancel(ctx), key)
	if err1 != nil || err2 != nil {
		return // the foreign lease ran out in between
	}
	if f1.Token != f2.Token {
		a.m.violation("fencelock", f1, "one foreign grant got tokens %d and %d", f1.Token, f2.Token)
	}
	g := &grant{f: f1, kind: "fencelock", start: start, end: end, actor: a.id}
	a.m.gmu.Lock()
	defer a.m.gmu.Unlock()
	for _, b := range a.m.foreign {
		if b.end.Before(g.start) && b.f.Token >= g.f.Token {
			a.m.violation("fencelock", fmt.Sprintf("%p %p", b, g), "foreign grant token %d after an earlier grant's %d", g.f.Token, b.f.Token)
		}
	}
	a.m.foreign = append(a.m.foreign, g)
	a.m.count("foreign grants", 1)
}

// modelConfig says what to run the model on.
type modelConfig struct {
	budget time.Duration
	seed   uint64
	wrap   func(m *model, l *lock.Lease, ttl time.Duration) modelLease
	// plain keeps to whole-millisecond TTLs, no Owner and no Extend, where
	// today's code keeps every promise: the negative controls' workload.
	plain bool
	// control says the run is a negative control's: it goes on past its
	// budget until its broken variant has gone wrong modelMinExposed times
	// (model.exposed), for at most modelExposureCap budgets.
	control bool
	// minExposed, when above modelMinExposed, is how often this control's
	// variant must go wrong before its run may end: for a variant whose
	// count is looser than what the judge can prove.
	minExposed int
	// hook, if set, is added to every actor's client (after the model's
	// own): a broken variant that changes what the Locker sends.
	hook func(m *model) redis.Hook
	// renewAtEnd replaces AutoRenew by the model's broken renewal, which
	// extends a lease only once its validity has run out.
	renewAtEnd bool
	// renewNominal replaces AutoRenew by the model's broken renewal that
	// is scheduled from the nominal ttl rather than from what is left.
	renewNominal bool
	// longLeases makes every lease four times as long: the drift control's
	// workload, where the drift allowance (1% of the lease, plus 2ms)
	// outgrows the time a loaded machine takes to send a grant.
	longLeases bool
	// exposeOnCheck counts a broken lease as gone wrong once a promise
	// check of it was conclusive, rather than once it was granted: for a
	// variant that is wrong only where the judge looks (a validity a few
	// milliseconds long), on a machine too loaded to check every lease.
	exposeOnCheck bool
	// floors are the least the run must judge of each kind. A run goes on
	// past its budget until it has, for at most modelExposureCap budgets
	// (a loaded machine runs fewer leases in a budget), and fails if it
	// still has not.
	floors []modelFloor
	// lostReplies runs the lost-reply scenario beside the workload
	// (model_lost_test.go).
	lostReplies bool
}

// A control's run proves something only if its broken variant went wrong
// in it, which on a loaded machine may take longer than the budget: it
// goes on until the variant has gone wrong modelMinExposed times, for at
// most modelExposureCap budgets. A sound run goes on likewise until it
// has judged its floors.
const (
	modelMinExposed  = 3
	modelExposureCap = 4
)

// runContext returns the context the actors run under: it ends once the
// budget has passed and the run has judged its floors (a control's: its
// variant has gone wrong often enough), at m.deadline at the latest.
func (m *model) runContext(budget time.Duration) (context.Context, context.CancelFunc) {
	// Each node's clock offset is known before the first grant, so the
	// first grants' tokens are judged against the clock.
	for _, n := range m.nodes {
		m.observe(context.Background(), n, m.prefix+"{"+m.resource+"}:lock")
	}
	// The budget counts from here, after the servers started.
	m.deadline = time.Now().Add(modelExposureCap * budget)
	ctx, cancel := context.WithDeadline(context.Background(), m.deadline)
	enough := func() bool {
		if m.cfg.control && m.exposed.Load() < max(modelMinExposed, int64(m.cfg.minExposed)) {
			return false
		}
		m.vmu.Lock()
		failed := len(m.viol) > 0
		m.vmu.Unlock()
		if failed && !m.cfg.control {
			// A run that found a violation fails whatever else it judges;
			// a broken Locker may never reach a state a floor counts.
			return true
		}
		for _, f := range m.floors() {
			if !f.after && m.stat(f.kind) < f.min {
				return false
			}
		}
		return true
	}
	go func() {
		t := time.NewTimer(budget)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !enough() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		cancel()
	}()
	return ctx, cancel
}

// runModel runs the single-node model on the shared Redis and returns it
// after the checks.
func runModel(t *testing.T, cfg modelConfig) *model {
	rc := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	m := newModel(t, cfg, prefix)
	m.nodes = []*modelNode{{c: rc}}
	m.quorum = 1
	began := time.Now()
	ctx, cancel := m.runContext(cfg.budget)
	defer cancel()

	// Every grant a release makes is published on the resource's channel.
	probe, err := lock.New(rc, lock.WithPrefix(prefix), lock.WithWait(lock.Backoff(0, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	ps := rc.Subscribe(ctx, keysOf(probe).ReleaseChannel(m.resource))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); m.listen(lctx, ps) }()

	const actors = 6
	var lockers []*lock.Locker
	var wg sync.WaitGroup
	for i := range actors {
		c := testenv.Redis(t)
		if i < actors-1 {
			// Queued waiters pause now and then (outermost, so that the
			// model dates each try from its real send).
			c.AddHook(pauseHook{m: m, mu: new(sync.Mutex), rng: rand.New(rand.NewPCG(m.seed, uint64(2000+i)))})
		}
		c.AddHook(queueHook{m})
		c.AddHook(renewHook{m})
		c.AddHook(slowReplyHook{})
		if cfg.hook != nil {
			c.AddHook(cfg.hook(m))
		}
		opts := []lock.Option{lock.WithPrefix(prefix)}
		kind := "acquire"
		if i == actors-1 {
			opts = append(opts, lock.WithWait(lock.Backoff(time.Millisecond, 20*time.Millisecond)))
			kind = "poll"
		}
		l, err := lock.New(c, opts...)
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
		a := &actor{m: m, id: i, l: l, kind: kind, rng: rand.New(rand.NewPCG(m.seed, uint64(i))), owner: fmt.Sprintf("owner-%d", i), direct: c}
		if i == actors-2 || i == actors-3 {
			a.fresh = true
			a.newLocker = func() *lock.Locker {
				l, err := lock.New(c, opts...)
				if err != nil {
					panic(err)
				}
				return l
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.run(ctx) }()
	}
	// The late-release scenario, on a resource of its own.
	wg.Add(1)
	go func() { defer wg.Done(); m.lateScenario(ctx, t, cfg) }()
	if cfg.lostReplies {
		// And the lost-reply scenario, on another.
		wg.Go(func() { m.lostScenario(ctx, t, false) })
	}
	wctx, wcancel := context.WithCancel(context.Background())
	bg.Add(1)
	go func() { defer bg.Done(); m.watch(wctx, rand.New(rand.NewPCG(m.seed, 1000))) }()
	wg.Wait()
	for _, l := range lockers {
		l.Close()
	}
	time.Sleep(20 * time.Millisecond) // the last hand-over messages
	wcancel()
	lcancel()
	bg.Wait()
	m.ran = time.Since(began)
	m.checkQueue()
	m.checkRenewals()
	m.checkShortStarts()
	return m
}

func newModel(t *testing.T, cfg modelConfig, prefix string) *model {
	wrap := cfg.wrap
	if wrap == nil {
		wrap = func(_ *model, l *lock.Lease, _ time.Duration) modelLease { return l }
	}
	return &model{
		t: t, seed: cfg.seed, resource: "model", prefix: prefix, wrap: wrap, plain: cfg.plain, cfg: cfg,
		holds: map[*held]struct{}{}, queue: map[string]*queued{}, served: map[string]fence.Token{},
		registered: map[string]bool{}, reentered: map[string]bool{}, trySent: map[string]time.Time{}, tryReplied: map[string]time.Time{}, jumped: map[string]bool{}, renewing: map[string]*held{}, earlyRenewal: map[string]bool{}, firstRenewal: map[string]time.Time{}, nodeGrants: map[string]map[int]int64{}, raised: map[string]map[int]int64{},
		stats: map[string]*atomic.Int64{}, seen: map[string]bool{},
	}
}

// modelFloor is the least a run must judge of one kind.
type modelFloor struct {
	kind string // a count's name
	min  int64
	// after says the kind is judged once the run is over, so the run
	// cannot wait for it.
	after bool
	// minBudget, if set, is the least budget the floor holds for: a kind
	// too rare for a short run is required of CI's longer ones only.
	minBudget time.Duration
}

// floors are the floors that hold for the run's budget.
func (m *model) floors() []modelFloor {
	var fs []modelFloor
	for _, f := range m.cfg.floors {
		if m.cfg.budget >= f.minBudget {
			fs = append(fs, f)
		}
	}
	return fs
}

// unparsedShare is the largest share of a source's replies the model may
// fail to read: a protocol that changed under it fails the run.
const unparsedShare = 100 // one in a hundred

// report logs the run's figures, its judgments against their floors, and
// fails t on a violation, on a judgment below its floor, or on too many
// replies of no known shape, naming the seed.
func (m *model) report(t *testing.T, name string) {
	t.Helper()
	floors := m.floors()
	m.statsMu.Lock()
	var names []string
	for k := range m.stats {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "\n  %-70s %d", k, m.stats[k].Load())
	}
	notes := m.notes
	m.statsMu.Unlock()
	t.Logf("%s: seed %d (replay: FENCEKIT_CHECK_SEED=%d), ran %v, %d violations%s", name, m.seed, m.seed, m.ran.Round(time.Millisecond), len(m.viol), b.String())
	var short []string
	var j strings.Builder
	for _, f := range floors {
		n := m.stat(f.kind)
		fmt.Fprintf(&j, "\n  %-56s %8d  floor %d", f.kind, n, f.min)
		if n < f.min {
			short = append(short, fmt.Sprintf("%s %d < %d", f.kind, n, f.min))
		}
	}
	// Replies the model could not read, against those it read, by source.
	for _, src := range []struct {
		unparsed string
		parsed   []string // prefixes of the counts of those read
	}{
		{"unparsed: queued tries' replies", []string{"queued tries' replies: "}},
		{"unparsed: release messages", []string{"hand-overs published", "queue announcements published", "wake-ups published"}},
		{"unparsed: Redlock acquire replies", []string{"Redlock acquire replies: "}},
	} {
		bad, good := m.stat(src.unparsed), int64(0)
		for _, k := range names {
			for _, p := range src.parsed {
				if strings.HasPrefix(k, p) {
					good += m.stat(k)
				}
			}
		}
		fmt.Fprintf(&j, "\n  %-56s %8d  of %d, at most 1 in %d", src.unparsed, bad, bad+good, unparsedShare)
		if bad > 0 && bad*unparsedShare > bad+good {
			short = append(short, fmt.Sprintf("%s %d of %d", src.unparsed, bad, bad+good))
		}
	}
	if len(floors) > 0 {
		t.Logf("%s: judgments%s", name, j.String())
	}
	for _, n := range notes {
		t.Logf("%s: %s", name, n)
	}
	if len(short) > 0 {
		t.Errorf("%s: judged too little (%s); replay with FENCEKIT_CHECK_SEED=%d", name, strings.Join(short, ", "), m.seed)
	}
	if len(m.viol) == 0 {
		return
	}
	// At most a few of each kind (all with FENCEKIT_CHECK_ALL=1), each
	// kind counted.
	show := 8
	if os.Getenv("FENCEKIT_CHECK_ALL") == "1" {
		show = len(m.viol)
	}
	perKind := map[string]int{}
	var kinds []string
	for _, v := range m.viol {
		k, _, _ := strings.Cut(v, ":")
		if perKind[k]++; perKind[k] <= show {
			t.Errorf("%s", v)
		}
		if perKind[k] == 1 {
			kinds = append(kinds, k)
		}
	}
	for _, k := range kinds {
		t.Errorf("%s: %d distinct violations", k, perKind[k])
	}
	t.Errorf("%s: %d violations; replay with FENCEKIT_CHECK_SEED=%d", name, len(m.viol), m.seed)
}

// TestLockModel runs the model on one Redis server.
func TestLockModel(t *testing.T) {
	t.Parallel()
	m := runModel(t, modelConfig{budget: modelBudget(t), seed: modelSeed(t), floors: lockModelFloors, lostReplies: true})
	m.report(t, "lock model")
}

// faultHook loses commands to a Redlock node while the node is flaky: the
// request (the node never ran it) or the reply (it did), each ending when
// the call's node timeout does.
//
// It also records, for the quorum check, each grant and each confirmed
// raise that reaches the actor's Locker.
type faultHook struct {
	m   *model
	idx int // the node's index
	n   *modelNode
	rng *rand.Rand
	mu  *sync.Mutex
}

func (h faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// The round that raises the granting nodes' token state (two keys:
		// the token state, then the lock) is lost more often, on any node.
		call, known := parseScriptCall(cmd.Args())
		raise := known && call.name == "raise"
		h.mu.Lock()
		r := h.rng.IntN(4)
		h.mu.Unlock()
		if !(h.n.flaky.Load() || raise) || r >= 2 {
			sent := time.Now()
			err := next(ctx, cmd)
			if err == nil && known {
				h.record(call, cmd, sent)
			}
			return err
		}
		if r == 1 {
			_ = next(ctx, cmd) // ran, and its reply is lost
		}
		h.n.lost.Add(1)
		t := time.NewTimer(200 * time.Millisecond)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		return errors.New("model: command lost")
	}
}

// record notes a grant or a confirmed raise that reached the Locker, and
// checks a node's token against its clock: a node issues max(counter+1,
// clock), so even one that lost its state issues no token below its
// clock when the call was sent.
func (h faultHook) record(call scriptCall, cmd redis.Cmder, sent time.Time) {
	c, ok := cmd.(*redis.Cmd)
	if !ok || len(call.argv) < 2 {
		return
	}
	var into map[string]map[int]int64
	var token int64
	switch call.name {
	case "acquire":
		r, ok := parseAcquireReply(c.Val())
		if !ok {
			h.m.count("unparsed: Redlock acquire replies", 1)
			h.m.note("a Redlock acquire reply of no known shape: %v", c.Val())
			return
		}
		h.m.count("Redlock acquire replies: "+r.shape, 1)
		if r.shape != shapeGranted || r.token < 1 {
			return
		}
		into, token = h.m.nodeGrants, r.token
		if !h.n.observed.Load() {
			h.m.count("node token anchor checks inconclusive", 1)
		} else if floor := sent.UnixMicro() + h.n.offset.Load() - modelSlack.Microseconds(); token < floor {
			h.m.violation("anchor", fmt.Sprintf("node %d %s", h.idx, call.argv[0]), "node %d granted token %d, %.3fms below its clock when the acquire was sent (kills so far: %d)",
				h.idx, token, float64(floor-token)/1000, h.n.kill.Load())
		} else {
			h.m.count("node token anchor checks", 1)
		}
	case "raise":
		if c.Val() != int64(1) {
			return
		}
		var err error
		if token, err = strconv.ParseInt(call.argv[1], 10, 64); err != nil {
			return
		}
		into = h.m.raised
	default:
		return
	}
	h.m.rmu.Lock()
	defer h.m.rmu.Unlock()
	holder := call.argv[0]
	if into[holder] == nil {
		into[holder] = map[int]int64{}
	}
	into[holder][h.idx] = max(into[holder][h.idx], token)
}

// runRedlockModel runs the model on five private Redis servers, with nodes
// killed (losing their data) and started again, nodes that lose commands,
// and token state written ahead on a node, as a node whose clock runs ahead
// leaves it.
func runRedlockModel(t *testing.T, cfg modelConfig) *model {
	redis.SetLogger(quietLogger{})
	const nodes = 5
	prefix := "model:"
	m := newModel(t, cfg, prefix)
	m.redlock = true
	m.quorum = nodes/2 + 1
	var traceMu sync.Mutex
	m.trace = map[string][]string{}
	lock.SetRedlockTrace(func(holder, line string) {
		traceMu.Lock()
		m.trace[holder] = append(m.trace[holder], time.Now().Format("15:04:05.000000")+" "+line)
		traceMu.Unlock()
	})
	defer lock.SetRedlockTrace(nil)
	m.traceMu = &traceMu
	var ahead []*lock.Locker // one single-node Locker per node, to write state ahead
	for range nodes {
		srv := testenv.StartRedis(t)
		n := &modelNode{srv: srv, c: srv.Client()}
		m.nodes = append(m.nodes, n)
		l, err := lock.New(n.c, lock.WithPrefix(prefix), lock.WithWait(lock.Backoff(0, 0)))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ahead = append(ahead, l)
	}
	began := time.Now()
	ctx, cancel := m.runContext(cfg.budget)
	defer cancel()

	const actors = 4
	var lockers []*lock.Locker
	var wg sync.WaitGroup
	for i := range actors {
		var clients []redis.UniversalClient
		for j, n := range m.nodes {
			c := redis.NewClient(&redis.Options{Addr: n.srv.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(faultHook{m: m, idx: j, n: n, rng: rand.New(rand.NewPCG(m.seed, uint64(100*i+j))), mu: new(sync.Mutex)})
			if cfg.hook != nil {
				c.AddHook(cfg.hook(m))
			}
			clients = append(clients, c)
		}
		l, err := lock.NewRedlock(clients, lock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
		a := &actor{m: m, id: i, l: l, kind: "poll", rng: rand.New(rand.NewPCG(m.seed, uint64(i))), owner: fmt.Sprintf("owner-%d", i)}
		wg.Add(1)
		go func() { defer wg.Done(); a.run(ctx) }()
	}
	wctx, wcancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); m.watch(wctx, rand.New(rand.NewPCG(m.seed, 1000))) }()
	go func() { defer bg.Done(); m.nemesis(ctx, ahead, rand.New(rand.NewPCG(m.seed, 2000))) }()
	wg.Wait()
	for _, l := range lockers {
		l.Close()
	}
	wcancel()
	bg.Wait()
	var lost int64
	for _, n := range m.nodes {
		lost += n.lost.Load()
	}
	m.count("faults: commands lost", lost)
	m.ran = time.Since(began)
	return m
}

// nemesis kills and restarts nodes (at most two down at once), makes nodes
// lose commands, and writes token state ahead on a node.
func (m *model) nemesis(ctx context.Context, ahead []*lock.Locker, rng *rand.Rand) {
	var downSince = map[int]time.Time{}
	skew := time.Now().UnixMicro() + 24*int64(time.Hour/time.Microsecond)
	for ctx.Err() == nil {
		time.Sleep(time.Duration(30+rng.IntN(150)) * time.Millisecond)
		i := rng.IntN(len(m.nodes))
		n := m.nodes[i]
		switch r := rng.IntN(100); {
		case r < 50:
			n.flaky.Store(!n.flaky.Load())
			m.count("faults: flaky toggles", 1)
		case r < 80:
			// Node 0's clock runs ahead: its token state keeps moving past
			// the others', as its clock-anchored tokens would.
			if m.nodes[0].down.Load() {
				continue
			}
			skew += int64(rng.IntN(1_000_000_000))
			actx, cancel := context.WithTimeout(ctx, time.Second)
			if ahead[0].Advance(actx, m.resource, fence.Token(skew)) == nil {
				m.count("faults: token state written ahead", 1)
			}
			cancel()
		case r < 83:
			if !n.down.Load() && len(downSince) < len(m.nodes)-m.quorum {
				n.kill.Add(1) // before the kill: a promise that spans it is excused
				n.down.Store(true)
				n.srv.Kill()
				// And after it: a grant that read the kill count between
				// the first count and the kill itself may still have been
				// granted by this node, and lost with its data.
				n.kill.Add(1)
				downSince[i] = time.Now()
				m.count("faults: nodes killed", 1)
			}
		default:
			for j, since := range downSince {
				if time.Since(since) > 300*time.Millisecond {
					// Up before it starts: while Restart waits for it, the
					// node may already grant, and a node marked down is
					// judged never to have held a lease granted meanwhile
					// (a false violation, seen once); a node not marked
					// down that does not answer is only left out.
					m.nodes[j].down.Store(false)
					m.nodes[j].srv.Restart()
					delete(downSince, j)
					m.count("faults: nodes restarted empty", 1)
					break
				}
			}
		}
	}
	for j := range downSince {
		m.nodes[j].down.Store(false) // before it starts, as above
		m.nodes[j].srv.Restart()
	}
	for _, n := range m.nodes {
		n.flaky.Store(false)
	}
}

// TestLockModelRedlock runs the model over Redlock on five private
// redis-servers.
func TestLockModelRedlock(t *testing.T) {
	testenv.Slow(t)
	m := runRedlockModel(t, modelConfig{budget: modelBudget(t), seed: modelSeed(t), floors: redlockModelFloors})
	m.report(t, "Redlock model")
}

// quietLogger drops go-redis's reports of dials to a node the Redlock
// model killed on purpose, and passes the rest on.
type quietLogger struct{}

func (quietLogger) Printf(_ context.Context, format string, v ...any) {
	if msg := fmt.Sprintf(format, v...); !strings.Contains(msg, "connection refused") {
		fmt.Fprintln(os.Stderr, "redis: "+msg)
	}
}
