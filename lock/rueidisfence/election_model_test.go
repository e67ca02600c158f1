package rueidisfence

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/redismon"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The election model (internal/harness/electionmodel) on Lockers of the
// rueidis client, as package election runs it on go-redis: candidates
// campaign on one private redis-server, each through a fault proxy of its
// own and a rueidis client of its own; a record write is held before the
// record's script is sent (the adapter's test hook); the planter writes a
// record above every term's straight into the record's hash. The server's
// history is its MONITOR feed, replayed (package redismon, as in package
// election's model). The observer watches through rueidis too. The
// controls are go-redis's (electionmodel.RedisControls): an unfenced
// elector (it believes it leads until a TTL after it last knew), the
// record script without its holder check or without its newer-record
// check, and a step-down within the drift allowance alone; the judge must
// reject each.

const modelTTL = 300 * time.Millisecond

// stepDownFloor is the least gap the judge accepts between a term's end
// and the lock's next grant once the lock ran out: a fifth of the
// documented default margin, as in package election's model.
const stepDownFloor = modelTTL / election.StepDownDivisor / 5

// modelClient is a rueidis client of addr for the model: short dials, and
// calls that end with their context.
func modelClient(t *testing.T, addr string) *client {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true,
		Dialer: net.Dialer{Timeout: 100 * time.Millisecond}, DisableRetry: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return newClient(rc)
}

// runElectionModel makes one run of the model and judges it.
func runElectionModel(t *testing.T, v electionmodel.Variant, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	srv := testenv.StartRedis(t)
	const prefix = "el:"
	oc := srv.Client()
	ol, err := newOn(modelClient(t, srv.Addr()), []lock.Option{lock.WithPrefix(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ol.Close)
	watcher, err := election.New(ol, "model", election.WithTTL(modelTTL))
	if err != nil {
		t.Fatal(err)
	}
	var names election.RedisNames
	if !watcher.As(&names) {
		t.Fatal("not an election on Redis")
	}
	recKey := names.RecordKey
	lockKey := recKey[:len(recKey)-len(":leader")] + ":lock"
	mon := redismon.Start(t, srv.Addr())
	plant, twin, older := electionmodel.RedisPlanters([]*redis.Client{oc}, recKey, modelTTL, ol, "model")
	mc := electionmodel.Config{
		Backend:  "rueidis",
		TTL:      modelTTL,
		Budget:   budget,
		Seed:     seed,
		Unfenced: v.Unfenced,
		Plant:    plant,
		Twin:     twin,
		Older:    older,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			p := testenv.StartProxy(t, srv.Addr())
			c := modelClient(t, p.Addr())
			l, err := newOn(c, []lock.Option{lock.WithPrefix(prefix)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			e, putHash, err := v.NewElection(l, "model", modelTTL)
			if err != nil {
				t.Fatal(err)
			}
			c.before = func(hash string, _, _ []string) {
				if hash == putHash {
					beforeRecord()
				}
			}
			return electionmodel.Candidate{Election: e, Cut: p.Block, Uncut: p.Unblock}
		},
		Observer: watcher,
		ObserverReady: func(ctx context.Context) bool {
			return oc.PubSubNumSub(ctx, names.Channel).Val()[names.Channel] >= 1
		},
	}
	h := electionmodel.Run(context.Background(), mc)
	return electionmodel.Judge(h, redismon.ServerLog(mon.Stop(), lockKey, recKey), stepDownFloor)
}

// TestElectionModel runs the model and requires no violation and enough
// judged, over up to four runs, as package election's model on go-redis.
func TestElectionModel(t *testing.T) {
	budget := electionmodel.Budget(t, 3*time.Second)
	floors := map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
		"record writes judged (holder)": 4, "record writes held past the TTL": 1, "records planted": 1,
		"records planted (twin)": 1, "records planted (older)": 1, "terms run out (step-down gap judged)": 1,
	}
	electionmodel.Check(t, "rueidis", floors, 4, func(seed uint64) *electionmodel.Verdict {
		return runElectionModel(t, electionmodel.Variant{}, seed, budget)
	})
}

// TestElectionModelControls runs go-redis's controls of the election
// model on rueidis, each over three seeds, each seed for up to two runs
// until it goes wrong: the judge must reject each in most seeds.
func TestElectionModelControls(t *testing.T) {
	budget := electionmodel.Budget(t, 3*time.Second)
	cs, err := electionmodel.RedisControls(modelTTL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		t.Run(strings.ReplaceAll(c.Name, " ", "_"), func(t *testing.T) {
			electionmodel.Rejects(t, "rueidis", c.Name, c.Kind, 3, 3, func(seed uint64) *electionmodel.Verdict {
				return runElectionModel(t, c.Variant, seed, budget)
			})
		})
	}
}
