package etcdtest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

// The election model on etcd with the record watch's nemesis: the
// observer's connections are held (a partition) until a new term writes
// its record, the cluster is compacted past that write, and the
// observer's connections are cut, so that its watch comes back at a
// revision the cluster no longer has. The model's observer check then
// judges that every term that acted was reported: the term written while
// the watch was cut included, read as the current record.

// compactionObserver returns the run's observer, reaching the members
// through proxies of its own, and the nemesis that cuts it.
func (m *etcdModel) compactionObserver(t *testing.T, prefix, name, dir string, direct *clientv3.Client) (*election.Election, []electionmodel.Fault) {
	var proxies []*testenv.Proxy
	var eps []string
	for _, mem := range m.c.Members {
		p := testenv.StartProxy(t, strings.TrimPrefix(mem.DirectURL(), "http://"))
		proxies = append(proxies, p)
		eps = append(eps, "http://"+p.Addr())
	}
	cc := clientConfig(eps...)
	// The watch comes back as soon as the proxies let it: a reconnection
	// after grpc's default backoff (a second and more) could come after
	// the term written meanwhile has ended, which no watch can report.
	cc.DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 300 * time.Millisecond},
		MinConnectTimeout: 2 * time.Second,
	})}
	cli, err := clientv3.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l, err := etcdlock.New(cli, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	e, err := election.New(l, name, election.WithTTL(etcdModelTTL))
	if err != nil {
		t.Fatal(err)
	}
	return e, []electionmodel.Fault{{
		Name:  "record watch cut, compacted past",
		Every: etcdModelTTL,
		Do: func(ctx context.Context, _ int) bool {
			return compactionCut(ctx, proxies, direct, prefix, dir+"/r")
		},
	}}
}

// compactionCut holds every byte between the observer and the members
// until a record is written (for four TTLs at most: a term lasts one to
// three), compacts the cluster past that write, then cuts the observer's
// connections, dropping what they held, and lets it through again. It
// reports whether a record was written while the observer was cut off.
func compactionCut(ctx context.Context, proxies []*testenv.Proxy, direct *clientv3.Client, prefix, rkey string) bool {
	get, err := direct.Get(ctx, rkey)
	if err != nil {
		return false
	}
	for _, p := range proxies {
		p.Block()
	}
	defer func() {
		for _, p := range proxies {
			p.CutAll()
			p.Unblock()
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, 4*etcdModelTTL)
	defer cancel()
	written := false
	for resp := range direct.Watch(wctx, rkey, clientv3.WithRev(get.Header.Revision+1)) {
		for _, ev := range resp.Events {
			written = written || ev.Type == clientv3.EventTypePut
		}
		if written {
			break
		}
	}
	if !written {
		return false
	}
	// Past the record's write: a put after it, and the compaction at that
	// put's revision.
	put, err := direct.Put(ctx, prefix+"compacted", "")
	if err != nil {
		return false
	}
	_, err = direct.Compact(ctx, put.Header.Revision)
	return err == nil
}

// TestElectionModelEtcdCompaction runs the election model on a
// one-member cluster of its own under the record watch's nemesis (no
// member restarts, so that only the observer's watch ever comes back
// after a compaction): every term that acted must be reported, and the
// runs must have cut the watch at least once.
//
// It has no control of its own: the election's observer also reads the
// leader every third of the TTL, so an observer whose watch resumes from
// the compaction's revision without reading the record still reports a
// term that lasts a TTL (0 of 2 seeds rejected). The record watch's
// control is TestRecordWatchResumesAfterCompaction's, deterministic.
// The cluster also serves the record's control: see below.
func TestElectionModelEtcdCompaction(t *testing.T) {
	testenv.Slow(t)
	m := &etcdModel{c: StartCluster(t, 1), mu: new(sync.Mutex)}
	budget := electionmodel.Budget(t, 15*time.Second)
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		floors := map[string]int{
			"terms": 3, "terms judged (observer)": 3, "faults: record watch cut, compacted past": 1,
		}
		electionmodel.Check(t, "etcd", floors, 3, func(seed uint64) *electionmodel.Verdict {
			return m.run(t, etcdModelRun{compaction: true}, seed, budget)
		})
	})
	// Beside it, on the same cluster, the record's control: candidates
	// whose record writes skip the holder check (RecordUnchecked). A
	// write held past the TTL (the model's) then lands after its lock ran
	// out: a phantom leader, which the record holder check must find in
	// most of three seeds.
	t.Run("record without the holder check control", func(t *testing.T) {
		t.Parallel()
		electionmodel.Rejects(t, "etcd", "record written without the holder check", "record holder", 3, 2, func(seed uint64) *electionmodel.Verdict {
			return m.run(t, etcdModelRun{compaction: true, recordUnchecked: true}, seed, budget)
		})
	})
}
