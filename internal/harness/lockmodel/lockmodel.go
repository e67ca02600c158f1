package lockmodel

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// Backend is what a lock backend supplies to the model.
type Backend struct {
	// Name names the backend in the summary line: "redis", "postgres",
	// "etcd".
	Name string

	// Locker returns actor's Locker, on connections of its own; the model
	// closes it at the end of the run. seen, which the backend calls (from
	// the Locker's client, before the call is sent) with the holder id of
	// each grant attempt it sends, tells the model which Acquire a queued
	// holder id belongs to; a backend that cannot see its calls leaves it
	// uncalled. seen may block: the model pauses some of a queued
	// waiter's tries there.
	Locker func(actor int, seen func(holder string)) (*lock.Locker, error)

	// Observe reads resource on the server, in one read.
	Observe func(ctx context.Context, resource string) (Observation, error)

	// Grants, if not nil, returns every grant the server made of resource
	// since the run began: the token of each holder id it granted (the
	// lowest, if it granted one holder twice). The queue check needs it.
	Grants func(ctx context.Context, resource string) (map[string]fence.Token, error)

	// Paths, if not nil, returns which of resource's grants and releases
	// since the run began the server made on its fast path (PostgreSQL's
	// plain SQL), as the server recorded it. The counts of fast-path
	// judgments ([FastGrantsJudged], [FastReleasesJudged]) need it.
	Paths func(ctx context.Context, resource string) (Paths, error)

	// Faults are what the backend can inject during a run with faults.
	Faults []Fault

	// Drift, if not nil, is the allowance by which the server holds a
	// lease of ttl past what its holder is told (Redlock's drift): a lease
	// believed until t must be held until t plus Drift(ttl) at least,
	// which the promise check judges by [Observation.Left].
	Drift func(ttl time.Duration) time.Duration

	// Close, if not nil, runs once the run has closed its Lockers: it
	// closes what Locker opened for them (their pools).
	Close func()
}

// Observation is one server-side read of a resource.
type Observation struct {
	// Holder holds the lock as the server decides it (the lease has not
	// ended on the server's clock or lease); "" when the lock is free.
	Holder string
	// Token is Holder's token.
	Token fence.Token
	// Waiters are the queue's entries, first in line first.
	Waiters []Waiter
	// Floor is a value every token granted after the read's reply
	// exceeds: PostgreSQL's clock in µs, etcd's 2^52 + the response
	// header's revision.
	Floor fence.Token
	// Left, if positive, is how long from the read the server holds
	// Holder's lease (under a quorum, the quorum holds it), on the
	// server's clock: a lease of Holder must not be believed past it
	// (with [Backend.Drift] added), which the promise check judges on
	// every observation. Zero when the backend does not say.
	Left time.Duration
}

// Waiter is one entry of a lock's queue, as the server read it.
type Waiter struct {
	Holder string
	// Life is how long, from the read on, the entry stays live without a
	// refresh; zero or less when it has lapsed.
	Life time.Duration
}

// Paths are the holder ids whose grant, and whose release, the server made
// on its fast path.
type Paths struct {
	// Grants are the holder ids the fast path granted the lock to.
	Grants map[string]bool
	// Releases are the holder ids whose lock the fast path freed.
	Releases map[string]bool
}

// Fault is a fault a backend injects and heals.
type Fault struct {
	Name string
	// Inject injects the fault and returns once it is healed (or ctx
	// ended).
	Inject func(ctx context.Context) error
	// Limit is how many times a run injects it at most; 0: no limit.
	Limit int
	// Lose, if not nil, is injected in place of Inject: it ends on the
	// server the lease of the lock's holder (an external revoke) and
	// returns what it ended. The promise check then excuses, for a bounded
	// time, the beliefs of that holder's Locker only (see [Loss]).
	Lose func(ctx context.Context) (Loss, error)
	// Fail, if not nil, is injected in place of Inject: it stops for good
	// the server that holds the resource, so that another one takes it
	// over with what was copied to it (a Redis Cluster master killed and
	// its replica promoted: replication is asynchronous, so the newest
	// writes may be missing there). It calls lost once the server is
	// stopped, and returns once another one serves the resource (or ctx
	// ended). The promise and release checks excuse only what the lost
	// server may have done alone: the promises of grants asked for before
	// lost was called, and the releases whose reply came before it; a
	// grant or a release sent after it is judged as any other.
	Fail func(ctx context.Context, lost func()) error
	// LosesState says Inject makes a node lose its data (a Redlock node
	// killed and started again empty): every token state that carried a
	// grant's token may be gone. A token pair whose earlier grant returned
	// before the fault ended and whose later grant was asked for after it
	// began is then excused when the earlier token was at or above the
	// clock floor the later grant was asked for after (the later token
	// may come from the clock alone), and judged otherwise. The promise's
	// excuse for such a node is the backend's to make (see [Nodes]).
	LosesState bool
}

// Loss is what a [Fault.Lose] ended on the server.
type Loss struct {
	// Holder is the holder id of the grant whose lease the server ended;
	// "" when the lock was free and nothing was ended. Every grant of the
	// same Locker made before Lose returned may have been on that lease.
	Holder string
	// Actor, when ActorKnown, is the actor whose Locker sent Holder's
	// grant attempt (a backend that sees its calls knows it even for an
	// attempt whose reply never came); otherwise the model finds it among
	// the grants that returned.
	Actor      int
	ActorKnown bool
	// Bound is how long after Lose returned the backend may take to learn
	// of the loss (its stated detection bound): until then a lease of that
	// Locker granted before the loss may still be believed while the
	// server has ended it, and the promise check excuses it; past it, a
	// belief the server does not hold is a violation.
	Bound time.Duration
}

// Config is one run's settings.
type Config struct {
	// Resource is the resource the actors lock; unique to the run.
	Resource string
	// Actors is how many Lockers drive it (default 5).
	Actors int
	// Budget is how long the workload runs (default [Budget]); while a
	// kind of Floors is judged fewer times than its floor, it goes on, to
	// Budgets times the budget at most.
	Budget time.Duration
	// Budgets bounds a run that goes on for its floors, in budgets
	// (default 4).
	Budgets int
	// Floors are the least judgments of each kind the run aims at (the
	// caller checks them with [Result.Check]).
	Floors map[string]int
	// Seed seeds the actors' schedules (default [Seed]).
	Seed uint64
	// Faults says the backend's faults are injected during the run.
	Faults bool
	// StopOnViolation ends the workload at the first violation of a
	// check that is judged while it runs (promise, tokens, anchor): what
	// a negative control needs.
	StopOnViolation bool
	// Label is added to the summary line ("postgres+faults").
	Label string
	// LateWait is how long a late release waits, after its lease ended on
	// the local clock, for another holder to have the lock (default
	// 1.5s). A backend whose server holds a lease much longer than asked
	// (etcd's whole seconds) sets it short, or the wait holds the lock.
	LateWait time.Duration
	// RenewTTL is the TTL of the leases that AutoRenew keeps; default
	// between 170ms and 270ms. A backend whose renewal takes a consensus
	// round (etcd) sets it longer.
	RenewTTL time.Duration
	// LongTTL, if positive, is the TTL of one in LongEvery tries and waiting
	// acquisitions (renewed ones aside): leases that stay believed past a
	// [Fault.Lose]'s bound unless the Locker learns of the loss, so that
	// the promise check sees a Locker that does not.
	LongTTL time.Duration
	// LongEvery is how many tries and waiting acquisitions there are per
	// long lease when LongTTL is set (default 8).
	LongEvery int
	// Uncontended, if positive, is a phase of that long before the random
	// workload (and beside its budget) in which nobody queues: the actors
	// only TryAcquire, so that the lock is granted while free or right
	// after a lease ran out, and released with no waiter, early, late or
	// never: the uncontended path a backend may serve otherwise than the
	// contended one (PostgreSQL's plain SQL). While a floor of Floors on
	// that path's judgments is not reached, the phase goes on, to four
	// times Uncontended at most.
	Uncontended time.Duration
	// LeaseScale, if above 1, multiplies the leases the workload asks for
	// (but not RenewTTL or LongTTL): for a judgment that needs longer
	// leases (Redlock's drift allowance is 1% of the lease, plus 2ms;
	// shorter leases leave it within the time a grant takes).
	LeaseScale int
	// LateExtend, if set, makes half the late releases that met another
	// holder's lock first send an Extend, which the extend check judges;
	// rng is drawn from only when it is set, so that the runs without it
	// keep their schedules.
	LateExtend bool
}

// Budget is FENCEKIT_CHECK_TIME, or 3s.
func Budget(t testing.TB) time.Duration {
	if s := os.Getenv("FENCEKIT_CHECK_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("FENCEKIT_CHECK_TIME=%q: not a positive duration", s)
		}
		return d
	}
	return 3 * time.Second
}

// Seed is FENCEKIT_CHECK_SEED, or a seed from the clock.
func Seed(t testing.TB) uint64 {
	if s := os.Getenv("FENCEKIT_CHECK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FENCEKIT_CHECK_SEED=%q: not an unsigned integer", s)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// The kinds of judgment, as the summary line names them.
const (
	Promise = "promise"
	// PromiseEnd: a promise judged against the lease's end on the server
	// ([Observation.Left]): the lease is not believed past it.
	PromiseEnd = "promises judged against the lease's end on the server"
	Tokens     = "tokens"
	Anchor     = "anchor"
	Queue      = "queue"
	Renewal    = "renewal"
	// Release: a release that answered "held" freed the lock; an
	// observation sent after its reply does not find its holder holding.
	Release = "release"
	// Extend: a late Extend (Config.LateExtend), sent while another lease
	// held the lock and answered while that lease still held it, is
	// refused: only the holder extends.
	Extend = "extend"
)

// States the workload must produce for the checks to decide, counted like
// judgments.
const (
	FreeWithWaiter = "free lock with a live waiter queued"
	LateReleaseMet = "late releases meeting another holder's lock"
	WaiterAhead    = "grants with a live waiter ahead"

	// FastGrantsJudged are grants the server made on its fast path (see
	// [Backend.Paths]) that a check judged: their token against earlier
	// grants or an observation's floor, or their promise.
	FastGrantsJudged = "fast-path grants judged"
	// FastReleasesJudged are releases the server made on its fast path
	// that the release check judged.
	FastReleasesJudged = "fast-path releases judged"
	// LateReleaseMetFast are late releases, in the uncontended phase,
	// that met the lock of a holder the fast path granted it to (after
	// the late lease ran out): the release must leave that lock alone,
	// which the holder's promise, observed at once, judges.
	LateReleaseMetFast = "late releases meeting a fast-path grant's lock"

	// RevokeJudged are promises judged within a [Fault.Lose]'s window, of
	// leases of the Locker whose lease it ended, granted before it;
	// RevokeExcused those of them the server did not hold (the overlap
	// between the server's end of the lease and the Locker's learning of
	// it); RevokePast the promises of such leases judged after the window.
	RevokeJudged  = "promises judged under a revoke"
	RevokeExcused = "promises excused by a revoke"
	RevokePast    = "promises of revoked Lockers judged past the bound"

	// FailoverJudged are promises judged after a [Fault.Fail] of leases
	// granted before it; FailoverExcused those of them the new server did
	// not hold (the lost server granted them, and their write may not have
	// been copied); FailoverReleasesExcused the releases answered by the
	// lost server that the new one had not seen.
	FailoverJudged          = "promises judged across a failover"
	FailoverExcused         = "promises excused by a failover (granted by the lost server)"
	FailoverReleasesExcused = "releases excused by a failover (answered by the lost server)"
	// FailoverTokens are token pairs judged across a [Fault.Fail]: the
	// earlier grant returned before the server was lost, the later one
	// was asked for after it. Tokens are not excused.
	FailoverTokens = "token pairs judged across a failover"
	// StateLossTokens are token pairs across a [Fault.LosesState],
	// StateLossExcused those of them excused (the earlier token at or
	// above the clock floor of the later grant).
	StateLossTokens  = "token pairs across a node's data loss"
	StateLossExcused = "token pairs excused by a node's data loss (the earlier token ahead of the clock)"

	renewalsLapsed = "renewals lapsed"
)

// DefaultFloors are the least judgments of each kind a run must make.
func DefaultFloors() map[string]int {
	return map[string]int{
		Promise:        20,
		Tokens:         15,
		Anchor:         5,
		Queue:          3,
		Renewal:        1,
		FreeWithWaiter: 1,
		LateReleaseMet: 1,
		WaiterAhead:    1,
	}
}

// Result is what one run judged.
type Result struct {
	Backend string
	Label   string
	Seed    uint64

	mu         sync.Mutex
	counts     map[string]int
	violations map[string][]string
}

func newResult(name, label string, seed uint64) *Result {
	return &Result{Backend: name, Label: label, Seed: seed, counts: map[string]int{}, violations: map[string][]string{}}
}

// NewResult is an empty Result, for a backend's own workload judged
// beside the model's (PostgreSQL's late grants), reported and checked as
// the model's are.
func NewResult(name, label string, seed uint64) *Result { return newResult(name, label, seed) }

// Add counts n judgments (or states) of kind.
func (r *Result) Add(kind string, n int) { r.count(kind, n) }

// Violate records a violation of the check kind.
func (r *Result) Violate(kind, format string, args ...any) { r.violate(kind, format, args...) }

func (r *Result) count(kind string, n int) {
	r.mu.Lock()
	r.counts[kind] += n
	r.mu.Unlock()
}

// set sets the count of kind to n.
func (r *Result) set(kind string, n int) {
	r.mu.Lock()
	r.counts[kind] = n
	r.mu.Unlock()
}

func (r *Result) violate(kind, format string, args ...any) {
	r.mu.Lock()
	r.violations[kind] = append(r.violations[kind], fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// Count returns how many judgments (or states) of kind the run made.
func (r *Result) Count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

// Violations returns the violations of the check kind.
func (r *Result) Violations(kind string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.violations[kind])
}

// Rejected reports whether the check kind found a violation.
func (r *Result) Rejected(kind string) bool { return len(r.Violations(kind)) > 0 }

// Violated returns the kinds of check that found a violation, sorted.
func (r *Result) Violated() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []string
	for k, v := range r.violations {
		if len(v) > 0 {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// Summary is the run's one line: "<backend> lock model judged: promise N,
// tokens N, anchor N, queue N, renewal N, ..." with the other counts after
// the five checks.
func (r *Result) Summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := r.Backend
	if r.Label != "" {
		name += "+" + r.Label
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s lock model judged:", name)
	main := []string{Promise, Tokens, Anchor, Queue, Renewal}
	for i, k := range main {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s %d", k, r.counts[k])
	}
	var rest []string
	for k := range r.counts {
		if !slices.Contains(main, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		fmt.Fprintf(&b, ", %s %d", k, r.counts[k])
	}
	fmt.Fprintf(&b, " (seed %d", r.Seed)
	if v := len(r.violations); v > 0 {
		n := 0
		for _, vs := range r.violations {
			n += len(vs)
		}
		fmt.Fprintf(&b, ", %d violations", n)
	}
	b.WriteString(")")
	return b.String()
}

// Check fails t for every violation and every kind judged fewer times
// than its floor.
func (r *Result) Check(t testing.TB, floors map[string]int) {
	t.Helper()
	for _, k := range r.Violated() {
		vs := r.Violations(k)
		for i, v := range vs {
			if i == 5 {
				t.Errorf("%s: %d more violations", k, len(vs)-i)
				break
			}
			t.Errorf("%s violated (seed %d, replay with FENCEKIT_CHECK_SEED=%d): %s", k, r.Seed, r.Seed, v)
		}
	}
	ks := make([]string, 0, len(floors))
	for k := range floors {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		if n := r.Count(k); n < floors[k] {
			t.Errorf("%s: judged %d, below the floor of %d (seed %d): the workload did not make the states that decide it", k, n, floors[k], r.Seed)
		}
	}
}

// Report logs the summary line and appends it to the file named by
// FENCEKIT_JUDGED_LOG, if set, so that CI's log lists the judgments per
// kind of every backend.
func (r *Result) Report(t testing.TB) {
	t.Helper()
	line := r.Summary()
	t.Log(line)
	if p := os.Getenv("FENCEKIT_JUDGED_LOG"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
			return
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, line); err != nil {
			t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
		}
	}
}
