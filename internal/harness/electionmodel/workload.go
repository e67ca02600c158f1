package electionmodel

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
)

// Candidate is one candidate of the model: an election on a Locker of its
// own, and a way to cut that Locker off from the server (every byte held,
// as a partition does) and to let it through again.
type Candidate struct {
	Election *election.Election
	Cut      func()
	Uncut    func()
}

// Fault is a backend's own fault, run now and then beside the model's
// nemesis (a session terminated, a member stopped).
type Fault struct {
	// Name counts the fault in the verdict ("faults: <Name>").
	Name string
	// Every is the mean pause between two runs.
	Every time.Duration
	// Do injects the fault; leader is the candidate that leads now, or -1.
	// It reports whether it injected anything.
	Do func(ctx context.Context, leader int) bool
}

// Config is one run of the model on one backend.
type Config struct {
	// Backend names the backend in the summary line ("postgres", "etcd").
	Backend string
	// TTL is every candidate's election TTL.
	TTL time.Duration
	// Candidates is how many candidates campaign (default 3).
	Candidates int
	// Budget is how long the candidates campaign.
	Budget time.Duration
	// Seed seeds the run's random choices (timing makes runs differ anyway).
	Seed uint64
	// NewCandidate makes candidate i. beforeRecord, if the backend can call
	// it, is to be called before each record write of the candidate's: it
	// may hold the write (and every byte of the candidate) past the TTL.
	NewCandidate func(i int, beforeRecord func()) Candidate
	// Observer is an election on a Locker connected directly, whose
	// Observe the model records.
	Observer *election.Election
	// ObserverReady, if not nil, reports whether the observer now hears
	// every record written; the candidates start once it does.
	ObserverReady func(ctx context.Context) bool
	// Plant writes a record with a token above every term's, as a server
	// whose clock went back would leave, and reports whether it did; nil
	// where the backend lets none be planted.
	Plant func(ctx context.Context) bool
	// Twin raises the lock's token counter and writes a record naming the
	// token the lock grants next, with another holder, as a second grant
	// of one token would leave (a forged or restored grant), and reports
	// whether it did; nil where the backend cannot tell its next token or
	// keeps no holder beside the record. The candidate granted that token
	// must not write over the record (it advances past it, as past a
	// planted one): a record is replaced only by a higher token, or by the
	// same token's own holder.
	Twin func(ctx context.Context) bool
	// Older writes a record one token below the live one, of the same
	// holder, and reports whether it did; nil where a read would not
	// find it (the SQL locks read only the record of the lock's grant,
	// token and holder). An observer that reads it must not report it
	// after the term it reported.
	Older func(ctx context.Context) bool
	// Faults are the backend's own faults.
	Faults []Fault
	// Unfenced makes the candidates believe they lead until a TTL after
	// they last knew, and act on that long when they lost the lock, past
	// the while they meant to hold the term (the negative control).
	Unfenced bool
	// UnfencedFor, if positive, is how long after they last knew the
	// candidates of an Unfenced run believe they lead (and act, even past
	// the while they meant to hold the term), instead of a TTL:
	// for a backend whose server keeps a lease a TTL past the last renewal
	// it acknowledged (etcd), where a cut-off elector that stops knowing at
	// the cut is past a TTL's belief before anyone else can win.
	UnfencedFor time.Duration
	// ObserveEvery, if positive, says the backend's observer learns of
	// terms only by reading the record this often (no notification: the
	// MySQL lock): a term believed for less than two such reads is one it
	// may miss, as the election's doc says, and is counted, not judged.
	ObserveEvery time.Duration
	// TermTTLs bounds how long a term acts before it resigns, in TTLs: a
	// random while between one TTL and TermTTLs+1 (default 4).
	TermTTLs int
	// ShortTerms makes one term in three resign within a TTL (between
	// half a TTL and one), before the nemesis or a backend's fault is
	// likely to end it: where those come as often as on PostgreSQL (a
	// cut, a terminated session and a silent connection, each every one
	// to three TTLs), nearly every longer term was ended first, and a run
	// resigned 0 to 2 terms (CI met the floor of two in the 4th of up to
	// 6 runs). rng is drawn from only when it is set.
	ShortTerms bool
	// RecordHold is how long a held record write waits, at least: long
	// enough for the lock to run out on the server (default the TTL).
	RecordHold time.Duration
	// NemesisEvery is the mean pause before the nemesis cuts the leader
	// off again (default the TTL): longer where a backend hands the lock
	// over slowly (the MySQL lock, whose waiters learn of a free lock by
	// reading it), so that some terms live to resign.
	NemesisEvery time.Duration
	// HoldAlone makes one held record write in two also cut the other
	// candidates off, from the hold until a while after the write went
	// on, so that it arrives after its lease ran out on the server and
	// before anyone else could take the lock: the server must refuse the
	// record of a grant whose lease has ended, though no other grant
	// holds the lock yet. rng is drawn from only when it is set.
	HoldAlone bool
}

// Term is one term of the history.
type Term struct {
	Actor  int
	Value  string
	Holder string
	Token  fence.Token
	Begun  time.Time // taken after Campaign returned: the term began at or before it
	DoneAt time.Time // when a goroutine saw the term's Done close
	Acts   []Act
	Lost   bool // ended by loss, not resignation
	// ByLeading: the actor checked each act with Term.Leading (the
	// others go by Term.Done).
	ByLeading bool
}

// Act is one action taken as leader: At is taken before the leadership
// check (the term was believed at some instant at or after it), Checked
// after the check succeeded.
type Act struct {
	At, Checked time.Time
}

// Interval is a span of the local clock.
type Interval struct{ From, To time.Time }

// History is what a run did, on the clients' side.
type History struct {
	Terms    []*Term
	Observed []election.Leader
	// Cuts holds, per candidate, when it was cut off (by the nemesis or a
	// held record write).
	Cuts [][]Interval
	// Counts counts the faults injected, by kind.
	Counts map[string]int
	// ObserveEvery is Config.ObserveEvery.
	ObserveEvery time.Duration
	// FirstCampaignError is the first error a Campaign failed with before
	// the run's end, if any (counted as "campaigns failed"): why a run
	// that made few terms made so few.
	FirstCampaignError error
}

type run struct {
	cfg     Config
	mu      sync.Mutex
	h       History
	leader  atomic.Int64 // the candidate that leads now, or -1
	cands   []Candidate
	cutMu   sync.Mutex
	cutAt   []time.Time // when candidate i was cut, zero when it is not
	heldMu  sync.Mutex
	heldTil time.Time // when the record write held now goes on
	heldBy  int
	// uncuts are the others' returns after a write held alone.
	uncuts sync.WaitGroup
	// firstErr is the first error a campaign failed with, for the
	// history's FirstCampaignError.
	firstErr atomic.Pointer[error]
}

func (r *run) count(kind string, n int) {
	r.mu.Lock()
	r.h.Counts[kind] += n
	r.mu.Unlock()
}

// cut cuts candidate i off; uncut lets it through and notes the interval.
// Nested cuts (a held write during the nemesis's) keep the outer one.
func (r *run) cut(i int) bool {
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	if !r.cutAt[i].IsZero() {
		return false
	}
	r.cands[i].Cut()
	r.cutAt[i] = time.Now()
	return true
}

func (r *run) uncut(i int) {
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	if r.cutAt[i].IsZero() {
		return
	}
	r.cands[i].Uncut()
	iv := Interval{From: r.cutAt[i], To: time.Now()}
	r.cutAt[i] = time.Time{}
	r.mu.Lock()
	r.h.Cuts[i] = append(r.h.Cuts[i], iv)
	r.mu.Unlock()
}

// Run runs the model's workload with cfg and returns its history. The
// backend's server-side history is read by the caller after Run returns.
func Run(ctx context.Context, cfg Config) *History {
	if cfg.Candidates == 0 {
		cfg.Candidates = 3
	}
	if cfg.TermTTLs == 0 {
		cfg.TermTTLs = 4
	}
	if cfg.RecordHold == 0 {
		cfg.RecordHold = cfg.TTL
	}
	if cfg.NemesisEvery == 0 {
		cfg.NemesisEvery = cfg.TTL
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{cfg: cfg, heldBy: -1, cutAt: make([]time.Time, cfg.Candidates)}
	r.h.ObserveEvery = cfg.ObserveEvery
	r.h.Counts = map[string]int{}
	r.h.Cuts = make([][]Interval, cfg.Candidates)
	r.leader.Store(-1)

	// The observer, started first so that it hears every term.
	octx, stopObserver := context.WithCancel(context.Background())
	defer stopObserver()
	observed := cfg.Observer.Observe(octx)
	obsDone := make(chan []election.Leader, 1)
	var (
		obsMu   sync.Mutex
		obsSeen = map[fence.Token]bool{}
	)
	go func() {
		var seen []election.Leader
		for l := range observed {
			seen = append(seen, l)
			obsMu.Lock()
			obsSeen[l.Token] = true
			obsMu.Unlock()
		}
		obsDone <- seen
	}()
	if cfg.ObserverReady != nil {
		for deadline := time.Now().Add(10 * time.Second); !cfg.ObserverReady(ctx) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}

	for i := range cfg.Candidates {
		hrng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+100))
		var hmu sync.Mutex
		r.cands = append(r.cands, cfg.NewCandidate(i, func() {
			hmu.Lock()
			defer hmu.Unlock()
			r.holdRecord(ctx, i, hrng)
		}))
	}
	var wg sync.WaitGroup
	for i := range cfg.Candidates {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		wg.Go(func() { r.actor(ctx, i, rng) })
	}
	// The nemesis: the leader cut off past the TTL and more, so that the
	// lock runs out before the lost term's release can reach the server:
	// the step-down gap is then judged against the next grant.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(cfg.Seed, 99))
		for {
			if !sleep(ctx, cfg.NemesisEvery/2+time.Duration(rng.Int64N(int64(cfg.NemesisEvery)))) {
				return
			}
			i := int(r.leader.Load())
			if i < 0 || !r.cut(i) {
				continue
			}
			r.count("faults: leader cut off", 1)
			sleep(ctx, cfg.TTL*3/2+time.Duration(rng.Int64N(int64(2*cfg.TTL))))
			r.uncut(i)
		}
	})
	if cfg.Plant != nil {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.Seed, 98))
			for sleep(ctx, 3*cfg.TTL+time.Duration(rng.Int64N(int64(3*cfg.TTL)))) {
				// A planter that wrote nothing (a twin's record stands
				// until its grant meets it) tries again every half TTL:
				// waiting its whole pause again left runs with no record
				// planted above every term.
				for !cfg.Plant(ctx) {
					if !sleep(ctx, cfg.TTL/2) {
						return
					}
				}
				r.count("records planted", 1)
			}
		})
	}
	// Twins and older records more often than the planter: a twin is met
	// only where its token's grant writes its record (a held write, a
	// cut-off candidate, a grant too late to announce write none), an
	// older record only where an observer reads it before the next term
	// writes over it.
	// An unfenced run (a control of one believer) plants neither: each
	// ends the term it meets through its record, and the control needs
	// terms that the nemesis's cuts end (it was rejected in 0 of 2 seeds
	// with them).
	for k, p := range []struct {
		kind  string
		plant func(context.Context) bool
	}{{"records planted (twin)", cfg.Twin}, {"records planted (older)", cfg.Older}} {
		if p.plant == nil || cfg.Unfenced {
			continue
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.Seed, 97-uint64(k)))
			for sleep(ctx, 2*cfg.TTL+time.Duration(rng.Int64N(int64(2*cfg.TTL)))) {
				// As the plain planter: one that wrote nothing tries
				// again every half TTL (the PostgreSQL twin control met
				// one twin a run and was rejected in 2 of 3 seeds).
				for !p.plant(ctx) {
					if !sleep(ctx, cfg.TTL/2) {
						return
					}
				}
				r.count(p.kind, 1)
			}
		})
	}
	for k, f := range cfg.Faults {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.Seed, 200+uint64(k)))
			for sleep(ctx, f.Every/2+time.Duration(rng.Int64N(int64(f.Every)))) {
				if f.Do(ctx, int(r.leader.Load())) {
					r.count("faults: "+f.Name, 1)
				}
			}
		})
	}
	sleep(ctx, cfg.Budget)
	cancel()
	for i := range r.cands {
		r.uncut(i)
	}
	wg.Wait()
	r.uncuts.Wait()
	// Let the last terms be reported before the observer stops: a TTL,
	// and then until every term that acted has been reported, for up to
	// ten TTLs more (a busy machine delays a notification, or the read
	// that follows a listener replaced, past one TTL; the judge still
	// requires each term reported, by then).
	time.Sleep(cfg.TTL)
	for deadline := time.Now().Add(10 * cfg.TTL); time.Now().Before(deadline); time.Sleep(cfg.TTL / 20) {
		r.mu.Lock()
		obsMu.Lock()
		all := true
		for _, t := range r.h.Terms {
			if len(t.Acts) > 0 && !obsSeen[t.Token] {
				all = false
			}
		}
		obsMu.Unlock()
		r.mu.Unlock()
		if all {
			break
		}
	}
	stopObserver()
	r.h.Observed = <-obsDone
	if e := r.firstErr.Load(); e != nil {
		r.h.FirstCampaignError = *e
	}
	return &r.h
}

// holdRecord holds candidate i's record write, now and then, past the TTL
// after its grant (Config.RecordHold), by up to a tenth of the TTL more, so that it arrives as the
// lock runs out and another candidate takes it: before or after that
// candidate has recorded itself. A candidate granted the lock while
// another's write is held writes its own record just after that one goes
// on, so that the held write meets the lock held by a candidate that has
// not recorded itself yet.
func (r *run) holdRecord(ctx context.Context, i int, rng *rand.Rand) {
	ttl := r.cfg.TTL
	r.heldMu.Lock()
	until, by := r.heldTil, r.heldBy
	hold := by < 0 && rng.IntN(2) == 0 && ctx.Err() == nil
	d := r.cfg.RecordHold + time.Duration(rng.Int64N(int64(ttl/10)))
	if hold {
		r.heldTil, r.heldBy = time.Now().Add(d), i
	}
	r.heldMu.Unlock()
	if !hold {
		if by >= 0 && by != i {
			time.Sleep(time.Until(until) + 20*time.Millisecond)
		}
		return
	}
	alone := r.cfg.HoldAlone && rng.IntN(2) == 0
	if r.cut(i) {
		r.count("record writes held past the TTL", 1)
		var others []int
		if alone {
			for j := range r.cands {
				if j != i && r.cut(j) {
					others = append(others, j)
				}
			}
		}
		sleep(ctx, d)
		r.uncut(i)
		if alone {
			// The write is sent on return; the others come back once it
			// has landed (on a slow machine, perhaps before: the write
			// then meets their grant, as one held without them does).
			if len(others) == len(r.cands)-1 {
				r.count("record writes held past the TTL alone", 1)
			}
			r.uncuts.Go(func() {
				time.Sleep(100 * time.Millisecond)
				for _, j := range others {
					r.uncut(j)
				}
			})
		}
	}
	r.heldMu.Lock()
	r.heldBy = -1
	r.heldMu.Unlock()
}

// actor campaigns, acts while it leads, and resigns, until ctx ends.
func (r *run) actor(ctx context.Context, id int, rng *rand.Rand) {
	ttl := r.cfg.TTL
	e := r.cands[id].Election
	value := "actor-" + strconv.Itoa(id)
	for ctx.Err() == nil {
		term, err := e.Campaign(ctx, value)
		if err != nil {
			if ctx.Err() == nil {
				r.count("campaigns failed", 1)
				r.firstErr.CompareAndSwap(nil, &err)
			}
			sleep(ctx, 10*time.Millisecond)
			continue
		}
		t := &Term{Actor: id, Value: value, Holder: term.Fence().Holder, Token: term.Fence().Token, Begun: time.Now(), ByLeading: id%2 == 0 && !r.cfg.Unfenced}
		doneAt := make(chan time.Time, 1)
		go func() {
			<-term.Done()
			doneAt <- time.Now()
		}()
		r.leader.Store(int64(id))
		hold := time.Now().Add(ttl + time.Duration(rng.Int64N(int64(r.cfg.TermTTLs)*int64(ttl))))
		if r.cfg.ShortTerms && rng.IntN(3) == 0 {
			hold = time.Now().Add(ttl/2 + time.Duration(rng.Int64N(int64(ttl/2))))
		}
		lastKnown := time.Now()
		for time.Now().Before(hold) && ctx.Err() == nil {
			at := time.Now()
			leads := term.Leading()
			if id%2 == 1 {
				// Half the actors go by Done, as Run's users do (their
				// ctx ends when it closes), half by Leading.
				select {
				case <-term.Done():
					leads = false
				default:
					leads = true
				}
			}
			if r.cfg.Unfenced {
				// The broken elector: it believes it leads for a TTL
				// (or UnfencedFor) after it last knew it did.
				if leads {
					lastKnown = at
				}
				believe := ttl
				if r.cfg.UnfencedFor > 0 {
					believe = r.cfg.UnfencedFor
				}
				if !leads {
					// It lost the lock and acts on, past the while it
					// meant to hold the term, as an elector that never
					// looks at its lease would: every term lost this way
					// overlaps the next one if that one begins within
					// believe (a loaded machine delays the next term's
					// start, not this one's acts). Before, a lost term
					// that had reached its planned end stopped acting, and
					// under load the control was rejected in 1 of 3 seeds.
					if until := lastKnown.Add(believe); until.After(hold) {
						hold = until
					}
				}
				leads = at.Sub(lastKnown) < believe
			}
			if !leads {
				break
			}
			t.Acts = append(t.Acts, Act{At: at, Checked: time.Now()})
			time.Sleep(time.Duration(1+rng.IntN(5)) * time.Millisecond)
		}
		r.leader.CompareAndSwap(int64(id), -1)
		t.Lost = term.Err() != nil
		rctx, cancel := context.WithTimeout(context.Background(), ttl)
		_ = term.Resign(rctx)
		cancel()
		t.DoneAt = <-doneAt
		r.mu.Lock()
		r.h.Terms = append(r.h.Terms, t)
		r.mu.Unlock()
	}
}

// sleep waits d or until ctx ends, and reports whether ctx goes on.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
