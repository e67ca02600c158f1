package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/redismon"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// The election model on Redis: the workload and the judge of
// internal/harness/electionmodel (its package doc says what they do and
// judge), with Redis's candidates, faults and history. Candidates
// campaign on one private redis-server, each through a fault proxy of its
// own; a record write is held through a go-redis hook on the record's
// script; the planter writes a record above every term's straight into
// the record's hash (as a Redis whose clock went back, or another backend,
// would leave), or a twin: the token the lock grants next (the counter
// raised by Advance to just below it) with another holder. The server's history is its MONITOR feed (package
// redismon), replayed: each grant and release of the lock key, and for each record a
// script wrote, who held the lock key then and which record it replaced
// while that one lived, on the server's clock (this machine's).
//
// The controls (electionmodel.RedisControls, shared with the rueidis
// client's model in lock/rueidisfence): an unfenced elector (it believes it
// leads until a TTL after it last knew, as client-go's and etcd's electors
// let a leader that pauses do), the record script without its holder check
// or its newer-record check, and a step-down within the drift allowance
// alone.
//
// FENCEKIT_CHECK_TIME sets a run's budget (default 3s).

const modelTTL = 300 * time.Millisecond

// stepDownFloor is the least gap the checker accepts between a term's end
// and the lock's next grant once the lock ran out: a fifth of the
// documented default margin (a quarter of the TTL: 15ms of 75ms), taken
// from the documentation, not from the code it judges. A loaded machine
// delays the old leader's timer by up to 45ms under -race (the gap's least
// seen: 30ms); a step-down within the drift allowance leaves 5-6ms.
const stepDownFloor = modelTTL / election.StepDownDivisor / 5

// runElectionModel makes one run of the model with cfg and judges it.
func runElectionModel(t *testing.T, cfg electionmodel.Variant, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	srv := testenv.StartRedis(t)
	const prefix = "el:"
	oc := srv.Client()
	wl := newLocker(t, oc, prefix)
	watcher, err := election.New(wl, "model", election.WithTTL(modelTTL))
	if err != nil {
		t.Fatal(err)
	}
	recKey := electionKeys(watcher).RecordKey
	lockKey := recKey[:len(recKey)-len(":leader")] + ":lock"
	mon := redismon.Start(t, srv.Addr())
	plant, twin, older := electionmodel.RedisPlanters([]*redis.Client{oc}, recKey, modelTTL, wl, "model")
	mc := electionmodel.Config{
		Backend:  "redis",
		TTL:      modelTTL,
		Budget:   budget,
		Seed:     seed,
		Unfenced: cfg.Unfenced,
		Plant:    plant,
		Twin:     twin,
		Older:    older,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			p := testenv.StartProxy(t, srv.Addr())
			c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			e, hash, err := cfg.NewElection(newLocker(t, c, prefix), "model", modelTTL)
			if err != nil {
				t.Fatal(err)
			}
			c.AddHook(recordHook{hash: hash, hold: beforeRecord})
			return electionmodel.Candidate{Election: e, Cut: p.Block, Uncut: p.Unblock}
		},
		Observer: watcher,
		ObserverReady: func(ctx context.Context) bool {
			return oc.PubSubNumSub(ctx, electionKeys(watcher).Channel).Val()[electionKeys(watcher).Channel] >= 1
		},
	}
	h := electionmodel.Run(context.Background(), mc)
	return electionmodel.Judge(h, redismon.ServerLog(mon.Stop(), lockKey, recKey), stepDownFloor)
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

// TestElectionModel runs the model and requires no violation and enough
// judged: terms both handed over and lost, and pairs decided. A run that
// judged less than a floor (a loaded machine makes fewer terms in the
// budget) is followed by another, up to four, and the floors hold for their
// sum.
func TestElectionModel(t *testing.T) {
	testenv.Slow(t)
	budget := electionmodel.Budget(t, 3*time.Second)
	floors := map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
		"record writes judged (holder)": 4, "record writes held past the TTL": 1, "records planted": 1,
		"records planted (twin)": 1, "records planted (older)": 1, "terms run out (step-down gap judged)": 1,
	}
	electionmodel.Check(t, "redis", floors, 4, func(seed uint64) *electionmodel.Verdict {
		return runElectionModel(t, electionmodel.Variant{}, seed, budget)
	})
}

// rejects runs the model with the control named name (of
// electionmodel.RedisControls) over three seeds, each for up to two runs
// until it goes wrong: the judge must report a violation of the control's
// kind in most of them.
func rejects(t *testing.T, name string) {
	t.Helper()
	testenv.Slow(t)
	c := redisControl(t, modelTTL, name)
	budget := electionmodel.Budget(t, 3*time.Second)
	electionmodel.Rejects(t, "redis", c.Name, c.Kind, 3, 3, func(seed uint64) *electionmodel.Verdict {
		return runElectionModel(t, c.Variant, seed, budget)
	})
}

// redisControl returns the control of electionmodel.RedisControls named
// name, for terms of ttl.
func redisControl(t *testing.T, ttl time.Duration, name string) electionmodel.Control {
	t.Helper()
	cs, err := electionmodel.RedisControls(ttl)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no election model control named %q", name)
	return electionmodel.Control{}
}

// TestElectionModelRejectsUnfenced is the negative control: an elector that
// believes it leads for a TTL after it last knew (ignoring the lease's
// validity) must be caught electing two leaders at once.
func TestElectionModelRejectsUnfenced(t *testing.T) {
	rejects(t, "unfenced elector")
}

// A record script that does not check that the lock holds the writer lets
// a candidate whose write was held past its lease record and announce
// itself while another holds the lock: the record-holder check rejects it.
func TestElectionModelRejectsPhantomRecord(t *testing.T) {
	t.Parallel() // judged on record writes, not on timing: beside the deployments' models
	rejects(t, "record written without the holder check")
}

// A record script that takes a lower token over a newer record (the
// planted one) is rejected by the record-token check.
func TestElectionModelRejectsLowerRecord(t *testing.T) {
	t.Parallel() // judged on record writes, not on timing: beside the deployments' models
	rejects(t, "record admitted below a newer one")
}

// A record script that takes a record of its own token from another
// holder (the twin planted with the next grant's token) is rejected by the
// record-token check.
func TestElectionModelRejectsTwinRecord(t *testing.T) {
	t.Parallel() // judged on record writes, not on timing: beside the deployments' models
	rejects(t, "record admitted over a twin")
}

// A leader that steps down at the end of its lease's validity less the
// drift allowance alone (a few milliseconds before the next grant) is
// rejected by the step-down check.
func TestElectionModelRejectsLateStepDown(t *testing.T) {
	rejects(t, "step-down within the drift allowance")
}
