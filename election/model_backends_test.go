package election_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/redismon"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The election model on the other Redis deployments: a Redis Cluster of
// three masters with a replica each (the election's keys in one slot, so
// the server's history is the MONITOR feed of that slot's master), and
// Redlock over five private servers (each node's own MONITOR feed, judged
// alone: a node writes a record only while it holds the writer's lock, and
// never over a newer one, and a term whose lock ran out ended a floor
// before the node granted the lock to the next term). The workload, its
// faults and the broken variants are the single server's
// (model_test.go); on Redlock a variant of the record's script is sent by
// a hook on each node's client, since the script is the single node's.

// deployModelTTL is the Cluster and Redlock runs' TTL: twice the single
// server's, since a candidate's calls there cross a proxy per node and
// (Redlock) five monitored servers, which answer slowly on a loaded
// machine: with 300 ms, at load 40, most Redlock campaigns failed and six
// runs made two terms, and the cluster's terms ended about as soon as
// their campaign returned (12 acts in four runs). The unfenced elector
// believes three of them past its last knowledge, as on MySQL and etcd:
// the next term began up to 520 ms (Cluster) and 1.2 s (Redlock) after a
// lost one's step-down there.
const deployModelTTL = 600 * time.Millisecond

// electionModelFloors are the floors of a run on Redis, Cluster or
// Redlock, summed over up to four runs.
func electionModelFloors() map[string]int {
	return map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
		"record writes judged (holder)": 4, "record writes held past the TTL": 1, "records planted": 1,
		"records planted (twin)": 1, "records planted (older)": 1, "terms run out (step-down gap judged)": 1,
	}
}

// TestElectionModelCluster runs the model and its controls on one private
// cluster, each run under a key prefix of its own.
func TestElectionModelCluster(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cl := testenv.StartCluster(t, 3, 1)
	budget := electionmodel.Budget(t, 4*time.Second) // terms of 1 to 5 TTLs of 600 ms
	run := func(t *testing.T, cfg electionmodel.Variant) func(seed uint64) *electionmodel.Verdict {
		return func(seed uint64) *electionmodel.Verdict { return runClusterElectionModel(t, cl, cfg, seed, budget) }
	}
	t.Run("model", func(t *testing.T) {
		electionmodel.Check(t, "redis-cluster", electionModelFloors(), 6, run(t, electionmodel.Variant{}))
	})
	// The twin's control is left to the single server's model (and the
	// rueidis client's): the record script is the same, and the model
	// here plants twins all the same.
	for _, c := range electionControls(t) {
		if c.Name == "record admitted over a twin" {
			continue
		}
		t.Run("rejects "+c.Name, func(t *testing.T) {
			electionmodel.Rejects(t, "redis-cluster", c.Name, c.Kind, 3, 3, run(t, c.Variant))
		})
	}
}

// TestElectionModelRedlock runs the model and its controls on Redlock,
// five private servers a run. A loaded machine makes fewer Redlock terms
// (a campaign needs a quorum in a third of the TTL): 4 s runs, up to six.
func TestElectionModelRedlock(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	budget := electionmodel.Budget(t, 4*time.Second)
	run := func(t *testing.T, cfg electionmodel.Variant) func(seed uint64) *electionmodel.Verdict {
		return func(seed uint64) *electionmodel.Verdict { return runRedlockElectionModel(t, cfg, seed, budget) }
	}
	t.Run("model", func(t *testing.T) {
		electionmodel.Check(t, "redlock", electionModelFloors(), 6, run(t, electionmodel.Variant{}))
	})
	// Redlock's waiters poll and a campaign needs a quorum within the node
	// timeout: on a loaded machine the next term was granted 350 ms to 1.2 s
	// after a lost term's end (with a 300 ms TTL, whose margin is 75 ms). So the unfenced
	// elector believes three TTLs past its last knowledge, not one (as on
	// etcd), and there is no step-down control: a step-down within the
	// drift allowance, or with no margin at all, was never caught (0 of 2
	// seeds each), and one only once a renewal fails in 1 of 3. The
	// step-down check still judges every lost term (its floor). The
	// twin's control is left to the single server's model, as on Cluster.
	cs := electionControls(t)[:3]
	for _, c := range cs {
		t.Run("rejects "+c.Name, func(t *testing.T) {
			electionmodel.Rejects(t, "redlock", c.Name, c.Kind, 3, 3, run(t, c.Variant))
		})
	}
}

// electionControls are the single server's controls (model_test.go), for
// the deployments' TTL.
func electionControls(t *testing.T) []electionmodel.Control {
	t.Helper()
	cs, err := electionmodel.RedisControls(deployModelTTL)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// runClusterElectionModel makes one run on cl under a prefix of its own.
func runClusterElectionModel(t *testing.T, cl *testenv.Cluster, cfg electionmodel.Variant, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	prefix := "elcluster:" + fence.NewHolder()[:12] + ":"
	oc := cl.Client()
	wl := newLocker(t, oc, prefix)
	watcher, err := election.New(wl, "model", election.WithTTL(deployModelTTL))
	if err != nil {
		t.Fatal(err)
	}
	keys := electionKeys(watcher)
	recKey := keys.RecordKey
	lockKey := recKey[:len(recKey)-len(":leader")] + ":lock"
	master, err := cl.MasterOf(recKey)
	if err != nil {
		t.Fatal(err)
	}
	mc := master.Client()
	mon := redismon.Start(t, master.Addr())
	plant, twin, older := electionmodel.RedisPlanters([]*redis.Client{mc}, recKey, deployModelTTL, wl, "model")
	var unfencedFor time.Duration
	if cfg.Unfenced {
		unfencedFor = 3 * deployModelTTL
	}
	h := electionmodel.Run(context.Background(), electionmodel.Config{
		Backend:     "redis-cluster",
		TTL:         deployModelTTL,
		Budget:      budget,
		Seed:        seed,
		Unfenced:    cfg.Unfenced,
		UnfencedFor: unfencedFor,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			// A proxy of the candidate's own before every node: the
			// cluster client dials a node's address through its proxy, so
			// that cutting the candidate cuts it off from the whole
			// cluster.
			proxies := map[string]*testenv.Proxy{}
			var addrs []string
			for _, n := range cl.Nodes {
				proxies[n.Addr()] = testenv.StartProxy(t, n.Addr())
				addrs = append(addrs, n.Addr())
			}
			var d net.Dialer
			c := redis.NewClusterClient(&redis.ClusterOptions{
				// A dial through a loaded machine's proxy takes more than
				// the single server's 100 ms: a cluster client dials every
				// node, and its slot map first.
				Addrs: addrs, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, MaxRetries: -1,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					if p := proxies[addr]; p != nil {
						addr = p.Addr()
					}
					return d.DialContext(ctx, network, addr)
				},
			})
			t.Cleanup(func() { _ = c.Close() })
			e, hash, err := cfg.NewElection(newLocker(t, c, prefix), "model", deployModelTTL)
			if err != nil {
				t.Fatal(err)
			}
			c.AddHook(recordHook{hash: hash, hold: beforeRecord})
			cut := func(block bool) func() {
				return func() {
					for _, p := range proxies {
						if block {
							p.Block()
						} else {
							p.Unblock()
						}
					}
				}
			}
			return electionmodel.Candidate{Election: e, Cut: cut(true), Uncut: cut(false)}
		},
		Observer: watcher,
		ObserverReady: func(ctx context.Context) bool {
			// On a cluster the channel is sharded: its master counts it.
			return mc.PubSubShardNumSub(ctx, keys.Channel).Val()[keys.Channel] >= 1
		},
		Plant: plant,
		Twin:  twin,
		Older: older,
	})
	return electionmodel.Judge(h, redismon.ServerLog(mon.Stop(), lockKey, recKey), deployModelTTL/election.StepDownDivisor/5)
}

// runRedlockElectionModel makes one run on five private servers.
func runRedlockElectionModel(t *testing.T, cfg electionmodel.Variant, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	const nodes = 5
	const prefix = "elredlock:"
	var srvs []*testenv.RedisServer
	var direct []*redis.Client
	var watchClients []redis.UniversalClient
	for range nodes {
		s := testenv.StartRedis(t)
		srvs = append(srvs, s)
		c := s.Client()
		direct = append(direct, c)
		watchClients = append(watchClients, c)
	}
	// Candidates poll (Redlock opens no subscription): every few
	// milliseconds, so that the next term begins soon after a lock runs
	// out and the step-down gap is judged against it.
	wait := lock.WithWait(lock.Backoff(2*time.Millisecond, 10*time.Millisecond))
	// Five monitored nodes answer slowly on a loaded machine: a node
	// timeout of half the TTL, not the default 50 ms, lets a quorum answer
	// in time (with a third, a run at load 30 made no term).
	nodeTimeout := lock.WithNodeTimeout(deployModelTTL / 2)
	wl, err := lock.NewRedlock(watchClients, lock.WithPrefix(prefix), wait, nodeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wl.Close)
	watcher, err := election.New(wl, "model", election.WithTTL(deployModelTTL))
	if err != nil {
		t.Fatal(err)
	}
	keys := electionKeys(watcher)
	recKey := keys.RecordKey
	lockKey := recKey[:len(recKey)-len(":leader")] + ":lock"
	var mons []*redismon.Monitor
	for _, s := range srvs {
		mons = append(mons, redismon.Start(t, s.Addr()))
	}
	plant, twin, older := electionmodel.RedisPlanters(direct, recKey, deployModelTTL, wl, "model")
	realHash := sha1Hex(electionmodel.RecordPutSource())
	var unfencedFor time.Duration
	if cfg.Unfenced {
		unfencedFor = 3 * deployModelTTL
	}
	h := electionmodel.Run(context.Background(), electionmodel.Config{
		Backend:     "redlock",
		TTL:         deployModelTTL,
		Budget:      budget,
		Seed:        seed,
		Unfenced:    cfg.Unfenced,
		UnfencedFor: unfencedFor,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			var proxies []*testenv.Proxy
			var clients []redis.UniversalClient
			once := &heldOnce{hold: beforeRecord, writes: map[string]chan struct{}{}}
			for _, s := range srvs {
				p := testenv.StartProxy(t, s.Addr())
				proxies = append(proxies, p)
				c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
				t.Cleanup(func() { _ = c.Close() })
				// The hold first (a record write is held on every node
				// at once), then the broken script, if any.
				c.AddHook(redlockRecordHook{hash: realHash, once: once})
				if cfg.RecordPut != "" {
					c.AddHook(scriptSwapHook{hash: realHash, src: cfg.RecordPut})
				}
				clients = append(clients, c)
			}
			l, err := lock.NewRedlock(clients, lock.WithPrefix(prefix), wait, nodeTimeout)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			opts := []election.Option{election.WithTTL(deployModelTTL)}
			if cfg.StepDown > 0 {
				opts = append(opts, election.WithStepDown(cfg.StepDown))
			}
			e, err := election.New(l, "model", opts...)
			if err != nil {
				t.Fatal(err)
			}
			cut := func(block bool) func() {
				return func() {
					for _, p := range proxies {
						if block {
							p.Block()
						} else {
							p.Unblock()
						}
					}
				}
			}
			return electionmodel.Candidate{Election: e, Cut: cut(true), Uncut: cut(false)}
		},
		Observer: watcher,
		ObserverReady: func(ctx context.Context) bool {
			for _, c := range direct {
				if c.PubSubNumSub(ctx, keys.Channel).Val()[keys.Channel] < 1 {
					return false
				}
			}
			return true
		},
		Plant: plant,
		Twin:  twin,
		Older: older,
	})
	// Each node's history alone, its grants only those of terms: a
	// candidate's attempt that a quorum refused may take a node whose
	// copy of the lock ran out while the term goes on at the quorum.
	terms := map[string]bool{}
	for _, r := range h.Terms {
		terms[r.Holder] = true
	}
	var logs []*electionmodel.ServerLog
	for _, m := range mons {
		s := redismon.ServerLog(m.Stop(), lockKey, recKey)
		kept := s.Events[:0]
		for _, e := range s.Events {
			if e.Kind != electionmodel.Granted || terms[e.Holder] {
				kept = append(kept, e)
			}
		}
		s.Events = kept
		logs = append(logs, s)
	}
	if h.FirstCampaignError != nil {
		t.Logf("redlock: the first campaign that failed: %v", h.FirstCampaignError)
	}
	return electionmodel.JudgeNodes(h, logs, deployModelTTL/election.StepDownDivisor/5)
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// heldOnce calls hold once per record write of a Redlock candidate, from
// the first node's call; the other nodes' calls of the same write wait
// for it, so that the whole write is held.
type heldOnce struct {
	hold   func()
	mu     sync.Mutex
	writes map[string]chan struct{}
}

func (o *heldOnce) before(write string) {
	o.mu.Lock()
	ch, ok := o.writes[write]
	if !ok {
		ch = make(chan struct{})
		o.writes[write] = ch
	}
	o.mu.Unlock()
	if ok {
		<-ch
		return
	}
	o.hold()
	close(ch)
}

// redlockRecordHook runs once.before for each call of the record's script
// (by its hash, or by its source after a NOSCRIPT), named by the write's
// holder and token.
type redlockRecordHook struct {
	hash string
	once *heldOnce
}

func (redlockRecordHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (redlockRecordHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h redlockRecordHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA hash 2 lock record holder token ...
		if a := cmd.Args(); len(a) > 6 && a[0] == "evalsha" && a[1] == h.hash {
			h.once.before(fmt.Sprint(a[5], " ", a[6]))
		}
		return next(ctx, cmd)
	}
}

// scriptSwapHook sends src by EVAL in place of the script whose hash is
// hash: a broken variant of it on a backend whose scripts a test cannot
// replace otherwise.
type scriptSwapHook struct{ hash, src string }

func (scriptSwapHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (scriptSwapHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h scriptSwapHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == h.hash {
			a[0], a[1] = "eval", h.src
		}
		return next(ctx, cmd)
	}
}
