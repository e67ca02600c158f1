package pglock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
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
// holder's Acquire returning. It reports the p50 and p99. unlogged-00006
// is the lock on a schema at migration 00006, before the fast path.
func BenchmarkHandoff(b *testing.B) {
	for _, mode := range []string{"unlogged", "unlogged-00006", "logged"} {
		b.Run(mode, func(b *testing.B) {
			var pool *pgxpool.Pool
			switch mode {
			case "unlogged-00006":
				pool = poolUpTo(b, lockBeforeFastPath)
			default:
				pool = migratedPool(b)
			}
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

// lockBeforeFastPath is the last migration before the uncontended fast
// path (00007): the lock as it was, for the before-and-after comparison.
const lockBeforeFastPath = 6

// lockBeforeGrant is the last migration before fencekit_lock_grant
// (00008): the grant answered in a row of five columns.
const lockBeforeGrant = 7

// poolUpTo is a pool in a schema of b's own with the migrations applied up
// to version (inclusive).
func poolUpTo(b *testing.B, version int64) *pgxpool.Pool {
	b.Helper()
	pool := testenv.Postgres(b)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := provider(b, db).UpTo(context.Background(), version); err != nil {
		b.Fatal(err)
	}
	return pool
}

// pairer is one contender of BenchmarkUncontendedPaired: pair runs one
// grant and one release, two round trips.
type pairer struct {
	name string
	pair func(ctx context.Context) error
	took []time.Duration
}

// lockPair is a TryAcquire+Release pair of be on resource.
func lockPair(be *backend) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		h := fence.NewHolder()
		if _, err := be.tryAcquire(ctx, "pgperf-bench", h, 10*time.Second); err != nil {
			return err
		}
		if held, err := be.release(ctx, "pgperf-bench", h); err != nil || !held {
			return fmt.Errorf("release: held %v, %v", held, err)
		}
		return nil
	}
}

// BenchmarkUncontendedPaired runs, in every iteration and in an order that
// turns, one uncontended grant + release pair of each contender, timing
// each, so that all see the same load; it reports each one's median pair
// and its ratio to the floor's. Contenders, each on a pool of its own
// (the same settings) and one resource:
//
//   - floor: pg_try_advisory_lock + pg_advisory_unlock through the pool,
//     as the lock's statements go; floor-conn: the same on one acquired
//     connection (the floor). A pool hands its idle connections
//     out in turn, and a connection that has sat idle answers more slowly
//     on this machine than the one just used;
//   - best-update: the least a lease table can do, one UPDATE ...
//     RETURNING each way on a table of (resource, holder, token, lease
//     end): the server clock's check, a raised token, nothing kept;
//     best-conn: the same on one acquired connection;
//   - lock: the lock (TryAcquire + Release of its backend, listening);
//     lock-conn: the same on a pool of one connection; lock-simple: on a
//     pool that sends statements in the simple protocol (no prepared
//     statements, as behind PgBouncer's older versions); lock-sql: its two
//     statements sent straight through the pool (the backend's own client
//     cost is lock - lock-sql); lock-00006: the lock on a schema migrated
//     to 00006 only, without the fast path; lock-logged: the lock on
//     logged tables.
//
// Each contender's median is reported, and its ratio to both floors.
func BenchmarkUncontendedPaired(b *testing.B) {
	ctx := context.Background()
	var ps []*pairer
	add := func(name string, pair func(ctx context.Context) error) {
		ps = append(ps, &pairer{name: name, pair: pair})
	}

	floorPool := migratedPool(b)
	floor := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var ok bool
			if err := q.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(0x70677065)).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("advisory lock: %v %v", ok, err)
			}
			if err := q.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, int64(0x70677065)).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("advisory unlock: %v %v", ok, err)
			}
			return nil
		}
	}
	add("floor", floor(floorPool))
	conn, err := migratedPool(b).Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	add("floor-conn", floor(conn))

	bestPool := migratedPool(b)
	if _, err := bestPool.Exec(ctx, `CREATE UNLOGGED TABLE pgperf_best (resource text PRIMARY KEY, holder text,
		token bigint NOT NULL, expires_at timestamptz); INSERT INTO pgperf_best VALUES ('pgperf-bench', NULL, 0, NULL)`); err != nil {
		b.Fatal(err)
	}
	best := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			h := fence.NewHolder()
			var token int64
			if err := q.QueryRow(ctx, `UPDATE pgperf_best SET holder = $2, token = token + 1,
			expires_at = clock_timestamp() + $3 * interval '1 millisecond'
			WHERE resource = $1 AND (holder IS NULL OR expires_at <= clock_timestamp()) RETURNING token`,
				"pgperf-bench", h, int64(10000)).Scan(&token); err != nil {
				return fmt.Errorf("best grant: %w", err)
			}
			if err := q.QueryRow(ctx, `UPDATE pgperf_best SET holder = NULL, expires_at = NULL
			WHERE resource = $1 AND holder = $2 AND expires_at > clock_timestamp() RETURNING token`,
				"pgperf-bench", h).Scan(&token); err != nil {
				return fmt.Errorf("best release: %w", err)
			}
			return nil
		}
	}
	add("best-update", best(bestPool))
	bestConn, err := bestPool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer bestConn.Release()
	add("best-conn", best(bestConn))

	lockPool := migratedPool(b)
	add("lock", lockPair(testBackend(b, lockPool, config{})))
	onePool := poolAt(b, lockPool, testenv.PostgresBaseURL(b), map[string]string{"pool_max_conns": "1"})
	add("lock-conn", lockPair(testBackend(b, onePool, config{})))
	simplePool := poolAt(b, lockPool, testenv.PostgresBaseURL(b), map[string]string{"default_query_exec_mode": "simple_protocol"})
	add("lock-simple", lockPair(testBackend(b, simplePool, config{})))
	sqlPool := migratedPool(b)
	add("lock-sql", func(ctx context.Context) error {
		h := fence.NewHolder()
		var (
			reply       []int64
			held        bool
			retentionMs = int64(60000)
		)
		if err := sqlPool.QueryRow(ctx, grantSQL, "pgperf-bench", h, int64(10000), retentionMs, nil, true, "infinity").
			Scan(&reply); err != nil || len(reply) < 2 || reply[0] != replyGranted {
			return fmt.Errorf("grant: %v, %v", reply, err)
		}
		if err := sqlPool.QueryRow(ctx, releaseSQL, "pgperf-bench", h, retentionMs).Scan(&held); err != nil || !held {
			return fmt.Errorf("release: held %v, %v", held, err)
		}
		return nil
	})
	add("lock-00006", lockPair(testBackend(b, poolUpTo(b, lockBeforeFastPath), config{})))
	add("lock-00007", lockPair(testBackend(b, poolUpTo(b, lockBeforeGrant), config{})))
	loggedPool := migratedPool(b)
	setLogged(b, loggedPool)
	add("lock-logged", lockPair(testBackend(b, loggedPool, config{})))

	// One pair of each first: statements prepared, rows created.
	for _, p := range ps {
		if err := p.pair(ctx); err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			start := time.Now()
			if err := p.pair(ctx); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			p.took = append(p.took, time.Since(start))
		}
		i++
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	meds := make([]float64, len(ps))
	for i, p := range ps {
		meds[i] = med(p.took)
		b.ReportMetric(meds[i], p.name+"-µs")
	}
	// ps[0] is the floor on the pool, ps[1] on one connection (the
	// issue's floor).
	for i, p := range ps[2:] {
		b.ReportMetric(meds[i+2]/meds[0], p.name+"/floor")
		b.ReportMetric(meds[i+2]/meds[1], p.name+"/floor-conn")
	}
}
