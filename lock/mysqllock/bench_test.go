package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// BenchmarkUncontendedPaired runs, in every iteration and in an order that
// turns, one uncontended grant + release pair of each contender, timing
// each, so that all see the same load, and reports each one's median pair
// and its ratio to the floor's:
//
//   - floor: GET_LOCK(name, 0) + RELEASE_LOCK(name) on one connection: no
//     token, no lease, nothing written;
//   - best-update: the least a lease table on InnoDB can do, one
//     autocommitted UPDATE each way on one connection: two commits, each
//     a redo log flush on a server with innodb_flush_log_at_trx_commit=1;
//   - lock: TryAcquire + Release of a Locker of New, through its pool;
//   - lock-poll: the same on a Locker with lock.WithWait (no doorbell),
//     whose pool holds one connection.
func BenchmarkUncontendedPaired(b *testing.B) {
	ctx := context.Background()
	type pairer struct {
		name string
		pair func() error
		took []time.Duration
	}
	var ps []*pairer
	add := func(name string, pair func() error) { ps = append(ps, &pairer{name: name, pair: pair}) }

	db := migrated(b)
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	add("floor", func() error {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK('fencekit-bench-floor', 0)`).Scan(&got); err != nil || got.Int64 != 1 {
			return fmt.Errorf("GET_LOCK: %v %v", got, err)
		}
		if err := conn.QueryRowContext(ctx, `SELECT RELEASE_LOCK('fencekit-bench-floor')`).Scan(&got); err != nil || got.Int64 != 1 {
			return fmt.Errorf("RELEASE_LOCK: %v %v", got, err)
		}
		return nil
	})
	// The least a lease table on InnoDB can do: one autocommitted UPDATE
	// each way (the server clock's check, a raised token), two commits.
	best := migrated(b)
	for _, q := range []string{
		`CREATE TABLE bench_best (resource VARBINARY(64) PRIMARY KEY, holder VARBINARY(64), token BIGINT NOT NULL, expires_us BIGINT) ENGINE=InnoDB`,
		`INSERT INTO bench_best VALUES ('bench', NULL, 0, NULL)`,
	} {
		if _, err := best.ExecContext(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	bestConn, err := best.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer bestConn.Close()
	add("best-update", func() error {
		h := fence.NewHolder()
		res, err := bestConn.ExecContext(ctx, `UPDATE bench_best SET holder = '`+h+`', token = token + 1,
			expires_us = `+nowUS+` + 10000000 WHERE resource = 'bench' AND (holder IS NULL OR expires_us <= `+nowUS+`)`)
		if n, _ := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("best grant: %d, %v", n, err)
		}
		res, err = bestConn.ExecContext(ctx, `UPDATE bench_best SET holder = NULL, expires_us = NULL
			WHERE resource = 'bench' AND holder = '`+h+`' AND expires_us > `+nowUS)
		if n, _ := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("best release: %d, %v", n, err)
		}
		return nil
	})
	pair := func(l *lock.Locker, resource string) func() error {
		return func() error {
			ls, err := l.TryAcquire(ctx, resource, 10*time.Second)
			if err != nil {
				return err
			}
			return ls.Release(ctx)
		}
	}
	add("lock", pair(newLocker(b, db), "bench"))
	one := migrated(b)
	one.SetMaxOpenConns(1)
	add("lock-poll", pair(newLocker(b, one, lock.WithWait(lock.Backoff(time.Millisecond, 10*time.Millisecond))), "bench"))

	for _, p := range ps {
		if err := p.pair(); err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			start := time.Now()
			if err := p.pair(); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			p.took = append(p.took, time.Since(start))
		}
		i++
	}
	b.StopTimer()
	meds := make([]float64, len(ps))
	for i, p := range ps {
		slices.Sort(p.took)
		meds[i] = float64(p.took[len(p.took)/2].Nanoseconds()) / 1e3
		b.ReportMetric(meds[i], p.name+"-µs")
	}
	for i, p := range ps[1:] {
		b.ReportMetric(meds[i+1]/meds[0], p.name+"/floor")
	}
}

// BenchmarkHandoff measures the hand-over of one resource among 8 and 100
// waiters, on 8 Lockers (8 processes, each with a doorbell; the 100
// waiters 12 or 13 to a Locker, to stay within a shared server's
// max_connections): from the start of the holder's release to the
// next holder's Acquire returning. It reports the p50 and p99, and the
// statements every Locker sent (grants, releases, the doorbells' reads and
// sleeps) per grant.
func BenchmarkHandoff(b *testing.B) {
	for _, waiters := range []int{8, 100} {
		b.Run(strconv.Itoa(waiters), func(b *testing.B) {
			db := migrated(b)
			const nLockers = 8
			db.SetMaxOpenConns(3 * nLockers)
			ctx := context.Background()
			var (
				mu        sync.Mutex
				lat       []time.Duration
				releasing atomic.Int64 // UnixNano of the last release's start
				left      atomic.Int64
				grants    atomic.Int64
				wg        sync.WaitGroup
			)
			left.Store(int64(max(b.N, 2*waiters)))
			lockers := make([]*lock.Locker, nLockers)
			for i := range lockers {
				lockers[i] = newLocker(b, db)
			}
			sent := func() int64 {
				var n int64
				for _, l := range lockers {
					n += lockbackend.Of(l).(*backend).sent.Load()
				}
				return n
			}
			start := sent()
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
						grants.Add(1)
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
				}(lockers[i%nLockers])
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			b.ReportMetric(float64(sent()-start)/float64(grants.Load()), "stmts/grant")
		})
	}
}
