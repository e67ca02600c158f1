package etcdtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/etcdtest/prevbackend"
)

// The benchmarks compare the etcd Locker with etcd's own concurrency
// package on the same three-member cluster, started once per benchmark,
// and with the Locker on the backend as it was before its keys shared a
// kept-alive lease ("fencekit-before", package prevbackend). Each run of
// a benchmark measures every variant in turn on its cluster; five runs
// (not -count, which repeats one variant before the next) interleave them:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'Uncontended|HandOff' -benchtime 300x ./...; done
//
// BenchmarkUncontendedPaired alternates the Locker and concurrency.Mutex
// within each iteration, the comparison to quote on a shared machine.
//	for i in 1 2 3 4 5; do go test -run '^$' -bench Failover -benchtime 5x ./...; done

// newPrevLocker makes a Locker on the backend before sessions.
func newPrevLocker(b *testing.B, cli *clientv3.Client, opts ...lock.Option) *lock.Locker {
	b.Helper()
	anyOpts := make([]any, len(opts))
	for i, o := range opts {
		anyOpts[i] = o
	}
	l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
		return prevbackend.New(cli, s)
	}, anyOpts)
	if err != nil {
		b.Fatal(err)
	}
	lk := l.(*lock.Locker)
	b.Cleanup(lk.Close)
	return lk
}

func testPrefix() lock.Option { return lock.WithPrefix("fk-" + fence.NewHolder()[:8] + ":") }

func session(b *testing.B, cli *clientv3.Client, ttl int) *concurrency.Session {
	b.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// warm writes to a new cluster for a while first, so that the variant
// measured first does not pay for what a cluster does once after it
// starts.
func warm(b *testing.B, c *Cluster) {
	b.Helper()
	cli := c.Client(b)
	ctx := context.Background()
	for range 300 {
		if _, err := cli.Put(ctx, "warm", "x"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUncontended measures one lock and unlock of a free lock.
func BenchmarkUncontended(b *testing.B) {
	c := StartCluster(b, 3)
	warm(b, c)
	ctx := context.Background()
	uncontended := func(b *testing.B, l *lock.Locker) {
		for b.Loop() {
			s, err := l.TryAcquire(ctx, "u", 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("fencekit", func(b *testing.B) { uncontended(b, newLocker(b, c)) })
	b.Run("fencekit-before", func(b *testing.B) { uncontended(b, newPrevLocker(b, c.Client(b), testPrefix())) })
	b.Run("fencekit-backend", func(b *testing.B) {
		// The backend alone, under the Locker: what the Locker adds.
		be := newBackend(b, c.Client(b))
		for b.Loop() {
			out, err := be.Try(ctx, req("u", 10*time.Second))
			if err != nil || !out.Granted {
				b.Fatal(out.Granted, err)
			}
			if err := be.Release(ctx, out.Hold); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		s := session(b, c.Client(b), 10)
		m := concurrency.NewMutex(s, "/bench-"+fence.NewHolder()[:8])
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkUncontendedPaired alternates one lock and unlock of a free lock
// on the Locker with one on concurrency.Mutex, on the same cluster, so
// that both see the same load within each iteration, and reports each
// one's time and their ratio: on a shared machine a fairer comparison
// than BenchmarkUncontended's variants one after the other.
func BenchmarkUncontendedPaired(b *testing.B) {
	c := StartCluster(b, 3)
	warm(b, c)
	ctx := context.Background()
	l := newLocker(b, c)
	m := concurrency.NewMutex(session(b, c.Client(b), 10), "/bench-"+fence.NewHolder()[:8])
	fk := func() {
		s, err := l.TryAcquire(ctx, "u", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	mu := func() {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// Both start with their lease granted: the Mutex's session is made
	// above, the Locker's shared lease by its first grant.
	fk()
	mu()
	// Each goes first every other iteration: the one that follows the
	// other's last write may find the cluster busier.
	pairs(b, fk, mu)
}

// BenchmarkHandOff8 measures the time per grant when 8 waiters contend for
// one lock, each taking it, holding it for no time, and releasing it.
func BenchmarkHandOff8(b *testing.B) {
	c := StartCluster(b, 3)
	warm(b, c)
	ctx := context.Background()
	run := func(b *testing.B, lockUnlock func(i int) error) {
		var n atomic.Int64
		total := int64(b.N)
		var wg sync.WaitGroup
		b.ResetTimer()
		for i := range 8 {
			wg.Go(func() {
				for n.Add(1) <= total {
					if err := lockUnlock(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	handOff := func(b *testing.B, l *lock.Locker) {
		run(b, func(int) error {
			s, err := l.Acquire(ctx, "h", 10*time.Second)
			if err != nil {
				return err
			}
			return s.Release(ctx)
		})
	}
	b.Run("fencekit", func(b *testing.B) { handOff(b, newLocker(b, c)) })
	b.Run("fencekit-before", func(b *testing.B) { handOff(b, newPrevLocker(b, c.Client(b), testPrefix())) })
	b.Run("concurrency.Mutex", func(b *testing.B) {
		pfx := "/bench-" + fence.NewHolder()[:8]
		var ms [8]*concurrency.Mutex
		for i := range ms {
			ms[i] = concurrency.NewMutex(session(b, c.Client(b), 10), pfx)
		}
		run(b, func(i int) error {
			if err := ms[i].Lock(ctx); err != nil {
				return err
			}
			return ms[i].Unlock(ctx)
		})
	})
}

// BenchmarkFailover measures how long a waiting candidate takes to lead
// after the leader's process dies without resigning (its client closed,
// its lease left to expire), with a 2s lease on both sides.
func BenchmarkFailover(b *testing.B) {
	c := StartCluster(b, 3)
	ctx := context.Background()
	failover := func(b *testing.B, newL func(*clientv3.Client, lock.Option) *lock.Locker) {
		pfx := testPrefix()
		next := newL(c.Client(b), pfx)
		var total time.Duration
		for b.Loop() {
			cli := c.Client(b)
			leader := newL(cli, pfx)
			if _, err := leader.Acquire(ctx, "leader", 2*time.Second); err != nil {
				b.Fatal(err)
			}
			got := make(chan *lock.Lease, 1)
			go func() {
				s, err := next.Acquire(ctx, "leader", 2*time.Second)
				if err != nil {
					b.Error(err)
				}
				got <- s
			}()
			time.Sleep(200 * time.Millisecond) // the candidate waits
			killed := time.Now()
			cli.Close() // the leader's process dies
			s := <-got
			total += time.Since(killed)
			if s != nil {
				_ = s.Release(ctx)
			}
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/failover")
	}
	b.Run("fencekit", func(b *testing.B) {
		failover(b, func(cli *clientv3.Client, pfx lock.Option) *lock.Locker {
			l, err := newLockerOn(b, cli, pfx)
			if err != nil {
				b.Fatal(err)
			}
			return l
		})
	})
	b.Run("fencekit-before", func(b *testing.B) {
		failover(b, func(cli *clientv3.Client, pfx lock.Option) *lock.Locker { return newPrevLocker(b, cli, pfx) })
	})
	b.Run("concurrency.Election", func(b *testing.B) {
		pfx := "/bench-" + fence.NewHolder()[:8]
		var total time.Duration
		for b.Loop() {
			cli := c.Client(b)
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
			if err != nil {
				b.Fatal(err)
			}
			if err := concurrency.NewElection(s, pfx).Campaign(ctx, "a"); err != nil {
				b.Fatal(err)
			}
			s2 := session(b, c.Client(b), 2)
			won := make(chan error, 1)
			e2 := concurrency.NewElection(s2, pfx)
			go func() { won <- e2.Campaign(ctx, "b") }()
			time.Sleep(200 * time.Millisecond)
			killed := time.Now()
			cli.Close()
			if err := <-won; err != nil {
				b.Fatal(err)
			}
			total += time.Since(killed)
			_ = e2.Resign(ctx)
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/failover")
	})
}

func newLockerOn(b *testing.B, cli *clientv3.Client, opts ...lock.Option) (*lock.Locker, error) {
	l, err := etcdlockNew(cli, opts...)
	if err == nil {
		b.Cleanup(l.Close)
	}
	return l, err
}

// BenchmarkUncontendedPairedRaw alternates, as BenchmarkUncontendedPaired
// does, the etcd requests of the Locker's uncontended pair with those of
// concurrency.Mutex's, sent bare on one client each with no library above
// them: what the two protocols cost the cluster, apart from the code that
// sends them. Ours: a transaction that puts the holder's key on a lease if
// the resource has no key, and the key's deletion. The Mutex's: a
// transaction that puts its key if absent and reads the first key of the
// prefix, and the key's deletion.
func BenchmarkUncontendedPairedRaw(b *testing.B) {
	c := StartCluster(b, 3)
	warm(b, c)
	ctx := context.Background()
	ours, theirs := c.Client(b), c.Client(b)
	grant := func(cli *clientv3.Client) clientv3.LeaseID {
		lg, err := cli.Grant(ctx, 10)
		if err != nil {
			b.Fatal(err)
		}
		ka, err := cli.KeepAlive(ctx, lg.ID)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for range ka {
			}
		}()
		return lg.ID
	}
	ol, tl := grant(ours), grant(theirs)
	dir := "fk-" + fence.NewHolder()[:8] + ":{u}/h/"
	okey, holder := dir+"0.0", fence.NewHolder()
	tpfx := "/bench-" + fence.NewHolder()[:8] + "/"
	tkey := tpfx + "0"
	fk := func() {
		resp, err := ours.Txn(ctx).
			If(clientv3.Compare(clientv3.Version(dir).WithPrefix(), "=", 0)).
			Then(clientv3.OpPut(okey, holder, clientv3.WithLease(ol))).
			Else(clientv3.OpGet(dir, clientv3.WithFirstCreate()...), clientv3.OpGet(okey)).
			Commit()
		if err != nil || !resp.Succeeded {
			b.Fatal(err)
		}
		if _, err := ours.Delete(ctx, okey); err != nil {
			b.Fatal(err)
		}
	}
	mu := func() {
		resp, err := theirs.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(tkey), "=", 0)).
			Then(clientv3.OpPut(tkey, "", clientv3.WithLease(tl)), clientv3.OpGet(tpfx, clientv3.WithFirstCreate()...)).
			Else(clientv3.OpGet(tkey), clientv3.OpGet(tpfx, clientv3.WithFirstCreate()...)).
			Commit()
		if err != nil || !resp.Succeeded {
			b.Fatal(err)
		}
		if _, err := theirs.Delete(ctx, tkey); err != nil {
			b.Fatal(err)
		}
	}
	fk()
	mu()
	pairs(b, fk, mu)
}

// pairs runs fk and mu once each per iteration, each first every other
// iteration, and reports each one's time per iteration and their ratio.
func pairs(b *testing.B, fk, mu func()) {
	var ours, theirs time.Duration
	first := true
	for b.Loop() {
		t0 := time.Now()
		if first {
			fk()
		} else {
			mu()
		}
		t1 := time.Now()
		if first {
			mu()
		} else {
			fk()
		}
		t2 := time.Now()
		if first {
			ours, theirs = ours+t1.Sub(t0), theirs+t2.Sub(t1)
		} else {
			ours, theirs = ours+t2.Sub(t1), theirs+t1.Sub(t0)
		}
		first = !first
	}
	b.ReportMetric(float64(ours.Microseconds())/float64(b.N), "fencekit-us/op")
	b.ReportMetric(float64(theirs.Microseconds())/float64(b.N), "mutex-us/op")
	b.ReportMetric(float64(ours)/float64(theirs), "fencekit/mutex")
}
