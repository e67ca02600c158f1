package election_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// A model of the election's promises. Candidates campaign on one private
// Redis, each through a fault proxy of its own; while a candidate leads it
// acts (as a leader would: a write, a scheduled job) for a random while,
// checking before each act that it still leads, then resigns; a nemesis
// cuts the current leader off from Redis (every byte held, as a partition
// does) for one to three TTLs at random moments, so that terms are also
// lost, not only handed over. An observer, connected directly, records what
// Observe reports. The history is one record per term: its token and value,
// when Campaign returned, and each act's instant.
//
// The checker judges:
//
//   - one believer: no act of a term happens after a later term began.
//     An act is timed from before its leadership check (so the term was
//     believed at some instant at or after that time), a term's beginning
//     from after Campaign returned (it began at or before that time): an
//     act timed after the next term's beginning proves that two candidates
//     believed they led at once. Scheduling delays only make a pair
//     inconclusive, never a violation.
//   - tokens: a term whose acts all came before another's acts has the
//     lower token.
//   - observers: every term that acted was reported by the observer, with
//     its value, and the reported tokens strictly increase.
//
// It counts what it judged and fails a run that judged too little (too
// few terms, hand-overs, losses, or pairs decided). The negative control
// runs an unfenced elector, which ignores its lease's validity and believes
// it leads until a TTL after it last knew it did (a leader that pauses and
// acts before it looks, as client-go's and etcd's electors let it); the
// checker must reject it.
//
// FENCEKIT_CHECK_TIME sets the run's budget (default 3s).

const modelTTL = 300 * time.Millisecond

func checkBudget(t *testing.T) time.Duration {
	if s := os.Getenv("FENCEKIT_CHECK_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("FENCEKIT_CHECK_TIME=%q: %v", s, err)
		}
		return d
	}
	return 3 * time.Second
}

// termRecord is one term of the history.
type termRecord struct {
	actor int
	value string
	token fence.Token
	begun time.Time // taken after Campaign returned: the term began at or before it
	acts  []act
	lost  bool // ended by loss, not resignation
}

// act is one action taken as leader: at is taken before the leadership
// check (the term was believed at some instant at or after it), checked
// after the check succeeded (at some instant at or before it).
type act struct {
	at, checked time.Time
}

type electionHistory struct {
	mu       sync.Mutex
	terms    []*termRecord
	observed []election.Leader
}

func (h *electionHistory) add(r *termRecord) {
	h.mu.Lock()
	h.terms = append(h.terms, r)
	h.mu.Unlock()
}

// verdict is what the checker judged and found.
type verdict struct {
	counts     map[string]int
	violations []string
}

func (v *verdict) count(k string, n int) { v.counts[k] += n }

func (v *verdict) violate(format string, args ...any) {
	v.violations = append(v.violations, fmt.Sprintf(format, args...))
}

// checkElection judges a history.
func checkElection(h *electionHistory) *verdict {
	v := &verdict{counts: map[string]int{}}
	terms := slices.Clone(h.terms)
	slices.SortFunc(terms, func(a, b *termRecord) int { return a.begun.Compare(b.begun) })
	for _, r := range terms {
		v.count("terms", 1)
		v.count("acts", len(r.acts))
		if r.lost {
			v.count("terms lost", 1)
		} else {
			v.count("terms resigned", 1)
		}
	}
	// One believer: every act of every term against the start of every
	// term that began after that term did.
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if b.token == a.token {
				v.violate("one believer: two terms with token %d", a.token)
				continue
			}
			for _, x := range a.acts {
				if x.at.After(b.begun) {
					v.violate("one believer: term %d (%s) acted %v after term %d (%s) began", a.token, a.value, x.at.Sub(b.begun), b.token, b.value)
					break
				}
			}
			if len(a.acts) > 0 {
				v.count("pairs judged (one believer)", 1)
			}
		}
	}
	// Tokens: the term whose acts came first has the lower token.
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if len(a.acts) == 0 || len(b.acts) == 0 {
				continue
			}
			if a.acts[len(a.acts)-1].checked.Before(b.acts[0].at) {
				v.count("pairs judged (tokens)", 1)
				if a.token >= b.token {
					v.violate("tokens: term %d (%s) acted before term %d (%s)", a.token, a.value, b.token, b.value)
				}
			}
		}
	}
	// Observers.
	seen := map[fence.Token]string{}
	for i, l := range h.observed {
		if i > 0 && l.Token <= h.observed[i-1].Token {
			v.violate("observer: token %d reported after %d", l.Token, h.observed[i-1].Token)
		}
		seen[l.Token] = l.Value
	}
	for _, r := range terms {
		if len(r.acts) == 0 {
			continue
		}
		v.count("terms judged (observer)", 1)
		if val, ok := seen[r.token]; !ok || val != r.value {
			v.violate("observer: term %d (%s) not reported (reported %q)", r.token, r.value, val)
		}
	}
	return v
}

// modelRun is one run of the model.
type modelRun struct {
	unfenced bool
	budget   time.Duration
}

func runElectionModel(t *testing.T, cfg modelRun) (*electionHistory, *verdict) {
	t.Helper()
	srv := testenv.StartRedis(t)
	const actors = 3
	const prefix = "el:"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	h := &electionHistory{}
	oc := srv.Client()
	watcher, err := election.New(newLocker(t, oc, prefix), "model", election.WithTTL(modelTTL))
	if err != nil {
		t.Fatal(err)
	}
	o := observe(ctx, t, oc, watcher)

	proxies := make([]*testenv.Proxy, actors)
	var leader atomic.Int64 // the actor that leads now, or -1
	leader.Store(-1)
	var wg sync.WaitGroup
	for i := range actors {
		proxies[i] = testenv.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: proxies[i].Addr(), ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		e, err := election.New(newLocker(t, c, prefix), "model", election.WithTTL(modelTTL))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
		wg.Go(func() { modelActor(ctx, e, i, cfg.unfenced, rng, h, &leader) })
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(modelTTL/2 + rand.N(modelTTL)):
			}
			i := leader.Load()
			if i < 0 {
				continue
			}
			proxies[i].Block()
			select {
			case <-ctx.Done():
			case <-time.After(modelTTL + time.Duration(rng.Int64N(int64(2*modelTTL)))):
			}
			proxies[i].Unblock()
		}
	})
	time.Sleep(cfg.budget)
	// Let the last terms be reported before the observer stops.
	time.Sleep(modelTTL)
	cancel()
	for _, p := range proxies {
		p.Unblock()
	}
	wg.Wait()
	<-o.done
	h.observed = o.seen
	return h, checkElection(h)
}

// modelActor campaigns, acts while it leads, and resigns, until ctx ends.
func modelActor(ctx context.Context, e *election.Election, id int, unfenced bool, rng *rand.Rand, h *electionHistory, leader *atomic.Int64) {
	value := "actor-" + strconv.Itoa(id)
	for ctx.Err() == nil {
		term, err := e.Campaign(ctx, value)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		r := &termRecord{actor: id, value: value, token: term.Fence().Token, begun: time.Now()}
		leader.Store(int64(id))
		hold := time.Now().Add(modelTTL + time.Duration(rng.Int64N(int64(4*modelTTL))))
		lastKnown := time.Now()
		for time.Now().Before(hold) && ctx.Err() == nil {
			at := time.Now()
			leads := term.Leading()
			if unfenced {
				// The broken elector: it looks at its lease only now and
				// then, and believes it leads for a TTL after it last knew.
				if leads {
					lastKnown = at
				}
				leads = at.Sub(lastKnown) < modelTTL
			}
			if !leads {
				break
			}
			r.acts = append(r.acts, act{at: at, checked: time.Now()})
			time.Sleep(time.Duration(1+rng.IntN(5)) * time.Millisecond)
		}
		leader.CompareAndSwap(int64(id), -1)
		r.lost = term.Err() != nil
		rctx, cancel := context.WithTimeout(context.Background(), modelTTL)
		_ = term.Resign(rctx)
		cancel()
		h.add(r)
	}
}

func reportModel(t *testing.T, name string, v *verdict) {
	t.Helper()
	var keys []string
	for k := range v.counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-35s %d", k, v.counts[k])
	}
	t.Logf("%s: %d violations%s", name, len(v.violations), b.String())
}

// TestElectionModel runs the model and requires no violation and enough
// judged: terms both handed over and lost, and pairs decided. A run that
// judged less than a floor (a loaded machine makes fewer terms in the
// budget) is followed by another, up to four, and the floors hold for their
// sum.
func TestElectionModel(t *testing.T) {
	testenv.Slow(t)
	floors := map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
	}
	judged := map[string]int{}
	short := func() (kinds []string) {
		for k, least := range floors {
			if judged[k] < least {
				kinds = append(kinds, fmt.Sprintf("%s = %d, want at least %d", k, judged[k], least))
			}
		}
		slices.Sort(kinds)
		return kinds
	}
	for run := 1; ; run++ {
		_, v := runElectionModel(t, modelRun{budget: checkBudget(t)})
		reportModel(t, fmt.Sprintf("fenced elector, run %d", run), v)
		for i, s := range v.violations {
			if i == 10 {
				t.Errorf("... %d violations in all", len(v.violations))
				break
			}
			t.Error(s)
		}
		for k, n := range v.counts {
			judged[k] += n
		}
		if len(short()) == 0 || run == 4 {
			break
		}
		t.Logf("judged too little so far (%s): another run", strings.Join(short(), ", "))
	}
	for _, s := range short() {
		t.Errorf("judged too little in four runs: %s", s)
	}
}

// TestElectionModelRejectsUnfenced is the negative control: an elector that
// believes it leads for a TTL after it last knew (ignoring the lease's
// validity) must be caught electing two leaders at once.
func TestElectionModelRejectsUnfenced(t *testing.T) {
	testenv.Slow(t)
	budget := checkBudget(t)
	for total := time.Duration(0); total < 4*budget; total += budget {
		_, v := runElectionModel(t, modelRun{unfenced: true, budget: budget})
		reportModel(t, "unfenced elector", v)
		for _, s := range v.violations {
			if strings.HasPrefix(s, "one believer") {
				t.Logf("rejected as it must be: %s", s)
				return
			}
		}
	}
	t.Fatal("the checker did not catch the unfenced elector with two leaders")
}
