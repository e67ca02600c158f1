package etcdtest

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// The election model (internal/harness/electionmodel) on etcd. Each
// candidate reaches every member through fault proxies of its own (the
// nemesis cuts the leader off from all three; a held record write blocks
// its candidate past the lease), and now and then the cluster's leader
// member is stopped and started again. The server's history is etcd's
// own: a watch of the run's keys (the lock's holder keys and the record,
// by the layout etcdlock documents) from the revision before the run,
// with each revision's local time when the watch delivered it. At each
// record put the lock's holder is the holder key with the lowest create
// revision; a grant is a revision at which that key changed, timed (an
// upper bound) when the watch saw it.
//
// etcd tells a release (a lease revoked by its holder) from a lease that
// ran out by nothing in its history, so a lost term is judged for its
// step-down gap only when its candidate was cut off from before the term
// ended until after the next grant was seen.

// etcdModelTTL is the terms' TTL: etcd leases have whole seconds, and the
// server refuses less than its minimum (1.5 election timeouts, rounded up:
// 2s at the default timings).
const etcdModelTTL = 2 * time.Second

// etcdStepDownFloor is a fifth of the documented default margin, as in the
// Redis model.
const etcdStepDownFloor = etcdModelTTL / election.StepDownDivisor / 5

// etcdModelRun is one run's variant.
type etcdModelRun struct {
	unfenced bool
	// compaction replaces the leader's restarts by the record watch's
	// nemesis (compactionCut): the observer reaches the members through
	// proxies of its own, which the nemesis cuts while a term writes its
	// record and the cluster compacts past it.
	compaction bool
	// recordUnchecked makes the candidates' backends the broken variant
	// that writes a record whether or not its grant still holds the lock.
	recordUnchecked bool
	// calm spaces the nemesis's cuts half as far apart again (the
	// checker's run, not the controls'): terms of 2–6 s were nearly all
	// cut off before they resigned, and CI met the floor of two
	// resignations only in the last of its three runs; twice as far apart,
	// a run lost no term now and then (1 of 3 runs).
	calm bool
}

// recordHold is a unary interceptor that calls hold before each
// transaction that puts a key ending in suffix (the record's write).
func recordHold(suffix string, hold func()) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*etcdserverpb.TxnRequest); ok && putsKey(txn, suffix) {
			hold()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func putsKey(txn *etcdserverpb.TxnRequest, suffix string) bool {
	for _, ops := range [][]*etcdserverpb.RequestOp{txn.Success, txn.Failure} {
		for _, op := range ops {
			if p := op.GetRequestPut(); p != nil && strings.HasSuffix(string(p.Key), suffix) {
				return true
			}
			if t := op.GetRequestTxn(); t != nil && putsKey(t, suffix) {
				return true
			}
		}
	}
	return false
}

// seenEvent is a watch event with the local time the watch delivered it.
type seenEvent struct {
	ev *clientv3.Event
	at time.Time
}

// watchFrom records every event under prefix from revision rev until it
// sees a put of the key end; done delivers them, or nil when the watch
// ended before.
func watchFrom(ctx context.Context, cli *clientv3.Client, prefix string, rev int64, end string) <-chan []seenEvent {
	done := make(chan []seenEvent, 1)
	go func() {
		var seen []seenEvent
		for resp := range cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
			at := time.Now()
			for _, ev := range resp.Events {
				if string(ev.Kv.Key) == end {
					done <- seen
					return
				}
				seen = append(seen, seenEvent{ev, at})
			}
		}
		done <- nil
	}()
	return done
}

// etcdServerLog replays the watched events of the election's directory
// dir ("<prefix>{<name>}") into the model's events.
func etcdServerLog(seen []seenEvent, dir string) *electionmodel.ServerLog {
	s := &electionmodel.ServerLog{}
	// A key is named by a slot of the Locker that put it, and holds the
	// holder id: key → the holder id and the key's create revision.
	type held struct {
		holder string
		rev    int64
	}
	holders := map[string]held{}
	first := func() (string, int64) {
		h, rev := "", int64(0)
		for _, k := range holders {
			if rev == 0 || k.rev < rev {
				h, rev = k.holder, k.rev
			}
		}
		return h, rev
	}
	var rec *electionmodel.Record
	lastHolder := ""
	for i, se := range seen {
		ev := se.ev
		key := string(ev.Kv.Key)
		switch {
		case strings.HasPrefix(key, dir+"/h/"):
			if ev.Type == clientv3.EventTypePut {
				if _, ok := holders[key]; !ok {
					holders[key] = held{string(ev.Kv.Value), ev.Kv.CreateRevision}
				}
			} else {
				delete(holders, key)
			}
		case key == dir+"/r":
			if ev.Type != clientv3.EventTypePut {
				rec = nil
				break
			}
			v := string(ev.Kv.Value)
			tok, val := parseModelRecord(v)
			e := electionmodel.Event{Kind: electionmodel.Recorded, At: se.at, Token: tok, Value: val, Replaced: rec}
			if h, rev := first(); rev != 0 {
				e.LockHolder, e.LockToken = h, etcdlock.TokenBase+fence.Token(rev)
			}
			s.Events = append(s.Events, e)
			rec = &electionmodel.Record{Token: tok}
		}
		// A revision's events come together: the lock's holder after the
		// last of them is the grant.
		if i+1 < len(seen) && seen[i+1].ev.Kv.ModRevision == ev.Kv.ModRevision {
			continue
		}
		if h, rev := first(); h != "" && h != lastHolder {
			s.Events = append(s.Events, electionmodel.Event{Kind: electionmodel.Granted, At: se.at, Holder: h, Token: etcdlock.TokenBase + fence.Token(rev)})
			lastHolder = h
		} else if h == "" {
			lastHolder = ""
		}
	}
	return s
}

// parseModelRecord reads a record's value as etcdlock writes it: its token
// in 16 digits, a newline, the value.
func parseModelRecord(v string) (fence.Token, string) {
	if len(v) < 17 || v[16] != '\n' {
		return 0, v
	}
	var n uint64
	for _, c := range v[:16] {
		if c < '0' || c > '9' {
			return 0, v
		}
		n = n*10 + uint64(c-'0')
	}
	return fence.Token(n), v[17:]
}

// etcdModel is a cluster shared by one test's runs.
type etcdModel struct {
	c  *Cluster
	mu *sync.Mutex // one member down at a time
}

// run makes one run of the model with cfg and judges it.
func (m *etcdModel) run(t *testing.T, cfg etcdModelRun, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := "elmodel/" + fence.NewHolder()[:8] + "/"
	const name = "model"
	dir := prefix + "{" + name + "}"
	direct := m.c.Client(t)
	opts := []election.Option{election.WithTTL(etcdModelTTL)}
	newElection := func(cli *clientv3.Client) *election.Election {
		l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
			b, err := backend.New(cli, s)
			if err != nil {
				return nil, err
			}
			b.RecordUnchecked = cfg.recordUnchecked
			return b, nil
		}, []any{lock.WithPrefix(prefix)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.(*lock.Locker).Close)
		e, err := election.New(l.(*lock.Locker), name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	var start *clientv3.GetResponse
	retryEtcd(t, func(ctx context.Context) (err error) {
		start, err = direct.Get(ctx, prefix+"none")
		return err
	})
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watched := watchFrom(wctx, direct, prefix, start.Header.Revision+1, prefix+"end")

	nemesisEvery := etcdModelTTL
	if cfg.calm {
		nemesisEvery = etcdModelTTL * 3 / 2
	}
	mc := electionmodel.Config{
		Backend:  "etcd",
		TTL:      etcdModelTTL,
		Budget:   budget,
		Seed:     seed,
		Unfenced: cfg.unfenced,
		// etcd keeps a lease a TTL past the last keep-alive it
		// acknowledged, and longer across a leader change: an elector cut
		// off stops knowing at the cut, so a TTL's belief after that ends
		// before another candidate can win. Three TTLs overlap the next
		// term whenever one is won while the cut lasts.
		UnfencedFor:  3 * etcdModelTTL,
		TermTTLs:     2,
		RecordHold:   etcdModelTTL * 3 / 2, // past the lease and the server's expiry check
		NemesisEvery: nemesisEvery,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			var proxies []*testenv.Proxy
			var eps []string
			for _, mem := range m.c.Members {
				p := testenv.StartProxy(t, strings.TrimPrefix(mem.DirectURL(), "http://"))
				proxies = append(proxies, p)
				eps = append(eps, "http://"+p.Addr())
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
				DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second,
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(recordHold("}/r", beforeRecord))}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			return electionmodel.Candidate{
				Election: newElection(cli),
				Cut: func() {
					for _, p := range proxies {
						p.Block()
					}
				},
				Uncut: func() {
					for _, p := range proxies {
						p.Unblock()
					}
				},
			}
		},
		Observer: newElection(direct),
		Faults:   m.faults(t),
	}
	if cfg.compaction {
		mc.Observer, mc.Faults = m.compactionObserver(t, prefix, name, dir, direct)
	}
	h := electionmodel.Run(ctx, mc)
	// Every write of the run, seen by the watch: up to the end's put.
	retryEtcd(t, func(ctx context.Context) error {
		_, err := direct.Put(ctx, prefix+"end", "1")
		return err
	})
	var seen []seenEvent
	select {
	case seen = <-watched:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not see the run's end within 30s")
	}
	if seen == nil {
		t.Fatal("the watch ended before the run's end")
	}
	return electionmodel.Judge(h, etcdServerLog(seen, dir), etcdStepDownFloor)
}

// faults are the model's own faults on etcd: the leader member restarted.
func (m *etcdModel) faults(t *testing.T) []electionmodel.Fault {
	return []electionmodel.Fault{{
		Name:  "leader member restarted",
		Every: 4 * etcdModelTTL,
		Do: func(ctx context.Context, _ int) bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			i := m.c.Leader(t)
			m.c.Stop(i)
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(500+rand.IntN(1000)) * time.Millisecond):
			}
			m.c.Restart(t, i)
			return true
		},
	}}
}

// retryEtcd runs call until it succeeds, for up to a minute: a member
// restarted by the other run sharing the cluster makes requests time out
// while the cluster elects a leader.
func retryEtcd(t *testing.T, call func(ctx context.Context) error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = call(ctx)
		cancel()
		if err == nil {
			return
		}
	}
	t.Fatal(err)
}

// TestElectionModelEtcd runs the election model on a three-member etcd
// cluster, under its faults, and requires no violation and enough judged
// of each kind; beside it on the same cluster (under its own prefix), the
// negative control: an elector that believes it leads for three TTLs after
// it last knew (ignoring its lease's validity) must be caught electing two
// leaders at once in most of three seeds.
//
// A late step-down (a margin of the drift allowance alone) is no control
// here: an etcd lease outlives its TTL on the server by up to the
// lessor's expiry check (500ms), so the next grant comes hundreds of
// milliseconds after even a late step-down (least gap seen: 175ms, above
// the floor).
func TestElectionModelEtcd(t *testing.T) {
	testenv.Slow(t)
	m := &etcdModel{c: StartCluster(t, 3), mu: new(sync.Mutex)}
	budget := electionmodel.Budget(t, 20*time.Second)
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		floors := map[string]int{
			"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
			"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 4,
			"record writes judged (holder)": 4, "record writes held past the TTL": 1,
			"terms run out (step-down gap judged)": 1, "faults: leader member restarted": 1,
		}
		electionmodel.Check(t, "etcd", floors, 3, func(seed uint64) *electionmodel.Verdict {
			return m.run(t, etcdModelRun{calm: true}, seed, budget)
		})
	})
	t.Run("unfenced control", func(t *testing.T) {
		t.Parallel()
		electionmodel.Rejects(t, "etcd", "unfenced elector", "one believer", 3, 2, func(seed uint64) *electionmodel.Verdict {
			return m.run(t, etcdModelRun{unfenced: true}, seed, budget)
		})
	})
}
