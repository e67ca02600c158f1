package election_test

import (
	"context"
	"fmt"
	"maps"
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
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// A model of the election's promises. Candidates campaign on one private
// Redis, each through a fault proxy of its own; while a candidate leads it
// acts (as a leader would: a write, a scheduled job) for a random while,
// checking before each act that it still leads, then resigns; a nemesis
// cuts the current leader off from Redis (every byte held, as a partition
// does) for one and a half to three and a half TTLs at random moments, so that terms are also
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
// and, from the server's own log of what it ran (a MONITOR feed, replayed;
// see monitor_test.go):
//
//   - record holder: every leader record a script wrote names the holder
//     of the lock at that instant (no phantom leader: a candidate that lost
//     its lock never records itself);
//   - record token: a record is never replaced, while it lives, by one with
//     a lower token (or the same token and another holder);
//   - step-down: a term whose lock ran out (rather than being released)
//     ended (its Done closed, on this machine's clock, the server's too) at
//     least a floor (a fifth of the documented step-down margin) before the
//     lock was next granted.
//
// The workload attacks the record too: now and then a candidate's record
// write is held (its proxy blocked) past the TTL after its grant, so that
// another candidate takes the lock as the write arrives, and a
// nemesis plants a record with a token above every term's (as a Redis whose
// clock went back, or another backend, would leave).
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

// stepDownFloor is the least gap the checker accepts between a term's end
// and the lock's next grant once the lock ran out: a fifth of the
// documented default margin (a quarter of the TTL: 15ms of 75ms), taken
// from the documentation, not from the code it judges. A loaded machine
// delays the old leader's timer by up to 45ms under -race (the gap's least
// seen: 30ms); a step-down within the drift allowance leaves 5-6ms.
const stepDownFloor = modelTTL / 4 / 5

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
	actor  int
	value  string
	holder string
	token  fence.Token
	doneAt time.Time // when a goroutine saw the term's Done close
	begun  time.Time // taken after Campaign returned: the term began at or before it
	acts   []act
	lost   bool // ended by loss, not resignation
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
	held     atomic.Int64 // record writes held past the TTL
	planted  atomic.Int64 // records planted above every term
	redis    []monCmd     // what the server ran
	lockKey  string
	recKey   string
	floor    time.Duration // the least gap between a lost term's end and the next grant
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
	gaps       []time.Duration // lost terms' ends to the next grants
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
	checkRedis(h, v)
	return v
}

// keyState is a key of the replay: its value (a string, or a hash's fields)
// and when it expires (zero: never).
type keyState struct {
	val    string
	fields map[string]string
	expiry time.Time
	exists bool
}

// alive reports whether the key exists at at, with slack in the direction
// that judges less: a script's time and its log line's differ by a little.
func (k *keyState) alive(at time.Time, slack time.Duration) bool {
	return k.exists && (k.expiry.IsZero() || at.Before(k.expiry.Add(slack)))
}

// checkRedis replays the server's log and judges the leader record's
// writes and the step-down gaps (see the model's comment).
func checkRedis(h *electionHistory, v *verdict) {
	const slack = 2 * time.Millisecond
	lk, rk := &keyState{}, &keyState{}
	grants := map[string]int{} // holder → index of its grant in h.redis
	type release struct{ holder string }
	released := map[int]release{} // index of a release (a DEL, a hand-over's SET) of a held lock → its holder
	for i, c := range h.redis {
		if len(c.args) < 2 {
			continue
		}
		switch key := c.args[1]; {
		case key == h.lockKey:
			switch c.args[0] {
			case "SET":
				if len(c.args) >= 5 && strings.EqualFold(c.args[3], "PX") {
					// Handed over by a release, unless the lock was about to
					// run out (the log's time and the script's differ a
					// little): a grant at its end is judged for the gap.
					if lk.alive(c.at, -slack) && lk.val != c.args[2] {
						released[i] = release{lk.val}
					}
					ms, _ := strconv.ParseInt(c.args[4], 10, 64)
					*lk = keyState{val: c.args[2], exists: true, expiry: c.at.Add(time.Duration(ms) * time.Millisecond)}
					if c.lua {
						grants[c.args[2]] = i
					}
				}
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.args[2], 10, 64); err == nil && lk.alive(c.at, 0) {
					lk.expiry = c.at.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				if lk.alive(c.at, 0) {
					released[i] = release{lk.val}
				}
				*lk = keyState{}
			}
		case key == h.recKey:
			switch c.args[0] {
			case "HSET":
				f := map[string]string{}
				for j := 2; j+1 < len(c.args); j += 2 {
					f[c.args[j]] = c.args[j+1]
				}
				if c.lua {
					judgeRecord(v, c, f, lk, rk, slack)
				}
				if !rk.alive(c.at, 0) {
					*rk = keyState{exists: true, fields: map[string]string{}}
				}
				maps.Copy(rk.fields, f)
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.args[2], 10, 64); err == nil && rk.alive(c.at, 0) {
					rk.expiry = c.at.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				*rk = keyState{}
			}
		}
	}
	// Step-down: each term against the next grant of the lock, when the
	// term's lock ran out rather than being released (a term lost, or
	// resigned while its release could not reach Redis).
	for _, r := range h.terms {
		gi, ok := grants[r.holder]
		if !ok || r.doneAt.IsZero() {
			continue
		}
		for j := gi + 1; j < len(h.redis); j++ {
			if rel, ok := released[j]; ok && rel.holder == r.holder {
				if r.lost {
					v.count("losses released (not judged for the gap)", 1)
				}
				break
			}
			c := h.redis[j]
			if !c.lua || c.args[0] != "SET" || len(c.args) < 3 || c.args[1] != h.lockKey || c.args[2] == r.holder {
				continue
			}
			gap := c.at.Sub(r.doneAt)
			v.count("terms run out (step-down gap judged)", 1)
			v.gaps = append(v.gaps, gap)
			if gap < h.floor {
				v.violate("step-down: term %d (%s) ended %v before the lock's next grant, below the floor %v", r.token, r.value, gap, h.floor)
			}
			break
		}
	}
}

// judgeRecord judges one leader record written by a script, against the
// lock and the record as the replay has them just before it.
func judgeRecord(v *verdict, c monCmd, f map[string]string, lk, rk *keyState, slack time.Duration) {
	holder, tok := f["h"], f["t"]
	if holder == "" || tok == "" {
		return
	}
	v.count("record writes judged (holder)", 1)
	if !lk.alive(c.at, slack) || lk.val != holder {
		who := "free"
		if lk.alive(c.at, slack) {
			who = "held by another holder"
		}
		v.violate("record holder: the record of term %s (%s) was written while the lock was %s: a phantom leader", tok, f["v"], who)
	}
	if !rk.alive(c.at, -slack) {
		return
	}
	was, _ := strconv.ParseUint(rk.fields["t"], 10, 64)
	now, _ := strconv.ParseUint(tok, 10, 64)
	v.count("record writes judged (token)", 1)
	if was > now || (was == now && rk.fields["h"] != holder) {
		v.violate("record token: the record of term %d (%s) replaced a live record of term %d (%s)", now, f["v"], was, rk.fields["v"])
	}
}

// modelRun is one run of the model.
type modelRun struct {
	unfenced  bool
	budget    time.Duration
	setLeader string        // a broken set_leader.lua, or "" for the real one
	stepDown  time.Duration // a step-down margin set past the option's checks, or 0
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
	h.lockKey = watcher.RecordKey()[:len(watcher.RecordKey())-len(":leader")] + ":lock"
	h.recKey = watcher.RecordKey()
	h.floor = stepDownFloor
	mon := startMonitor(t, srv.Addr())
	o := observe(ctx, t, oc, watcher)

	proxies := make([]*testenv.Proxy, actors)
	var leader atomic.Int64 // the actor that leads now, or -1
	leader.Store(-1)
	var heldMu sync.Mutex
	var heldUntil time.Time // when the record write held now goes on
	heldBy := -1
	var wg sync.WaitGroup
	for i := range actors {
		proxies[i] = testenv.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: proxies[i].Addr(), ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		e, err := election.New(newLocker(t, c, prefix), "model", election.WithTTL(modelTTL))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.setLeader != "" {
			election.UseSetLeader(e, cfg.setLeader)
		}
		if cfg.stepDown != 0 {
			election.SetStepDown(e, cfg.stepDown)
		}
		rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
		// Now and then, hold the record write after a grant (and every
		// other byte of this candidate) past the TTL, by up to a tenth of
		// it more, so that it arrives as the lock runs out and another
		// candidate takes it: before or after that candidate has recorded
		// itself.
		// A candidate granted the lock while another's write is held
		// writes its own record just after that one goes on, so that the
		// held write meets the lock held by a candidate that has not
		// recorded itself yet.
		hrng := rand.New(rand.NewPCG(uint64(i)+7, uint64(time.Now().UnixNano())))
		var hmu sync.Mutex
		c.AddHook(recordHook{hash: election.SetLeaderHash(e), hold: func() {
			hmu.Lock()
			defer hmu.Unlock()
			heldMu.Lock()
			until, by := heldUntil, heldBy
			hold := by < 0 && hrng.IntN(2) == 0 && ctx.Err() == nil
			d := modelTTL + time.Duration(hrng.Int64N(int64(modelTTL/10)))
			if hold {
				heldUntil, heldBy = time.Now().Add(d), i
			}
			heldMu.Unlock()
			if !hold {
				if by >= 0 && by != i {
					time.Sleep(time.Until(until) + 20*time.Millisecond)
				}
				return
			}
			h.held.Add(1)
			proxies[i].Block()
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			proxies[i].Unblock()
			heldMu.Lock()
			heldBy = -1
			heldMu.Unlock()
		}})
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
			// Past the TTL and more, so that the lock runs out before the
			// lost term's release can reach Redis: the step-down gap is
			// then judged against the next grant.
			case <-time.After(modelTTL*3/2 + time.Duration(rng.Int64N(int64(2*modelTTL)))):
			}
			proxies[i].Unblock()
		}
	})
	// The planter: a record with a token above every term's, as a Redis
	// whose clock went back would leave. Candidates must advance past it,
	// never write under it.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(98, uint64(time.Now().UnixNano())))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(3*modelTTL + time.Duration(rng.Int64N(int64(3*modelTTL)))):
			}
			tok, err := oc.HGet(ctx, h.recKey, "t").Uint64()
			if err != nil {
				continue // no record now
			}
			planted := strconv.FormatUint(tok+5_000_000, 10) // 5 s of the server's clock ahead
			if err := oc.HSet(ctx, h.recKey, "v", "planted", "t", planted, "h", "planted-holder").Err(); err != nil {
				continue
			}
			oc.PExpire(ctx, h.recKey, 3*modelTTL)
			h.planted.Add(1)
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
	h.redis = mon.stop()
	v := checkElection(h)
	v.count("record writes held past the TTL", int(h.held.Load()))
	v.count("records planted", int(h.planted.Load()))
	return h, v
}

// recordHook runs hold before each call of the election's record script.
type recordHook struct {
	hash string
	hold func()
}

func (recordHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (recordHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (r recordHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == r.hash {
			r.hold()
		}
		return next(ctx, cmd)
	}
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
		r := &termRecord{actor: id, value: value, holder: term.Fence().Holder, token: term.Fence().Token, begun: time.Now()}
		doneAt := make(chan time.Time, 1)
		go func() {
			<-term.Done()
			doneAt <- time.Now()
		}()
		leader.Store(int64(id))
		hold := time.Now().Add(modelTTL + time.Duration(rng.Int64N(int64(4*modelTTL))))
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
		r.doneAt = <-doneAt
		h.add(r)
	}
}

// reportModel logs the run's summary line, in the form every backend's
// election model logs it ("redis election model judged (...): ...").
func reportModel(t *testing.T, name string, v *verdict) {
	t.Helper()
	electionmodel.Log(t, electionmodel.Summary("redis", name, &electionmodel.Verdict{Counts: v.counts, Violations: v.violations, Gaps: v.gaps}))
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
		"record writes judged (holder)": 4, "record writes held past the TTL": 1, "records planted": 1,
		"terms run out (step-down gap judged)": 1,
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

// The broken variants the controls run: the election's record script with
// one check taken out, and a step-down at the end of the lease's validity
// less the drift allowance alone (the rule before the margin).
var (
	setLeaderCheck = "if not ok or cur ~= ARGV[1] then\n  return 0\nend"
	setLeaderAdmit = "if was > token or (was == token and rec[2] ~= ARGV[1]) then"
)

// brokenSetLeader returns set_leader.lua with old replaced by new, and
// fails t if old is not there (the control would run the real script).
func brokenSetLeader(t *testing.T, old, new string) string {
	t.Helper()
	src := election.SetLeaderSource()
	if !strings.Contains(src, old) {
		t.Fatalf("set_leader.lua no longer holds %q: update the control", old)
	}
	return strings.Replace(src, old, new, 1)
}

// rejects runs the model with cfg for up to four budgets until the checker
// reports a violation starting with kind, and fails t if it never does.
func rejects(t *testing.T, name string, cfg modelRun, kind string) {
	t.Helper()
	budget := checkBudget(t)
	for total := time.Duration(0); total < 4*budget; total += budget {
		cfg.budget = budget
		_, v := runElectionModel(t, cfg)
		reportModel(t, name, v)
		for _, s := range v.violations {
			if strings.HasPrefix(s, kind) {
				t.Logf("rejected as it must be: %s", s)
				return
			}
		}
	}
	t.Fatalf("the checker did not reject %s with a %q violation", name, kind)
}

// A record script that does not check that the lock holds the writer lets
// a candidate whose write was held past its lease record and announce
// itself while another holds the lock: the record-holder check rejects it.
func TestElectionModelRejectsPhantomRecord(t *testing.T) {
	testenv.Slow(t)
	rejects(t, "record written without the holder check", modelRun{setLeader: brokenSetLeader(t, setLeaderCheck, "")}, "record holder")
}

// A record script that takes a lower token over a newer record (the
// planted one) is rejected by the record-token check.
func TestElectionModelRejectsLowerRecord(t *testing.T) {
	testenv.Slow(t)
	rejects(t, "record admitted below a newer one", modelRun{setLeader: brokenSetLeader(t, setLeaderAdmit, "if false then")}, "record token")
}

// A leader that steps down at the end of its lease's validity less the
// drift allowance alone (a few milliseconds before the next grant) is
// rejected by the step-down check.
func TestElectionModelRejectsLateStepDown(t *testing.T) {
	testenv.Slow(t)
	rejects(t, "step-down within the drift allowance", modelRun{stepDown: election.Drift(modelTTL)}, "step-down")
}
