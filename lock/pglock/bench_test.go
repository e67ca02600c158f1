package pglock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// setLogged makes the lock's tables of pool's schema logged (WAL-written),
// for the durability comparison: everything else is the same.
func setLogged(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{`ALTER TABLE fencekit_lock SET LOGGED`, `ALTER TABLE fencekit_lock_waiter SET LOGGED`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUncontended measures TryAcquire+Release pairs on one resource
// from one goroutine, each pair two statements: the lock on an UNLOGGED
// table (the choice), on a logged one, and the floor, PostgreSQL's session
// advisory lock (pg_try_advisory_lock + pg_advisory_unlock on one
// connection: no token, no lease, nothing kept).
func BenchmarkUncontended(b *testing.B) {
	for _, mode := range []string{"unlogged", "logged"} {
		b.Run("pglock-"+mode, func(b *testing.B) {
			pool := migratedPool(b)
			if mode == "logged" {
				setLogged(b, pool)
			}
			be := testBackend(b, pool, config{poll: true})
			ctx := context.Background()
			for b.Loop() {
				h := fence.NewHolder()
				if _, err := be.tryAcquire(ctx, "bench", h, 10*time.Second); err != nil {
					b.Fatal(err)
				}
				if held, err := be.release(ctx, "bench", h); err != nil || !held {
					b.Fatal(held, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
		})
	}
	b.Run("advisory-floor", func(b *testing.B) {
		pool := migratedPool(b)
		ctx := context.Background()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Release()
		for b.Loop() {
			var ok bool
			if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(42)).Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := conn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, int64(42)).Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	})
}

// BenchmarkHandoff measures the hand-over of one resource among 8
// waiters, each with a Locker (a LISTEN connection) of its own, as 8
// processes would: from the start of the holder's release to the next
// holder's Acquire returning. It reports the p50 and p99.
func BenchmarkHandoff(b *testing.B) {
	for _, mode := range []string{"unlogged", "logged"} {
		b.Run(mode, func(b *testing.B) {
			pool := migratedPool(b)
			if mode == "logged" {
				setLogged(b, pool)
			}
			const waiters = 8
			ctx := context.Background()
			var (
				mu        sync.Mutex
				lat       []time.Duration
				releasing atomic.Int64 // UnixNano of the last release's start
				left      atomic.Int64
				wg        sync.WaitGroup
			)
			left.Store(int64(b.N))
			lockers := make([]*lock.Locker, waiters)
			for i := range lockers {
				l, err := New(pool)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				lockers[i] = l
			}
			b.ResetTimer()
			for i := range waiters {
				wg.Add(1)
				go func(l *lock.Locker) {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						ls, err := l.Acquire(ctx, "handoff", 10*time.Second)
						if err != nil {
							b.Error(err)
							return
						}
						if r := releasing.Load(); r != 0 {
							mu.Lock()
							lat = append(lat, time.Since(time.Unix(0, r)))
							mu.Unlock()
						}
						releasing.Store(time.Now().UnixNano())
						if err := ls.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}(lockers[i])
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
