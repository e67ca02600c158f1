package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// lostUpdateRun is what one run of the increment workload saw.
type lostUpdateRun struct {
	acked, refused, final, paused int64
	retryable                     int64 // refused by a serialization failure

	mu      sync.Mutex
	byLevel map[pgx.TxIsoLevel]*[3]int64 // fenced transactions committed, stale, retryable
}

func (r *lostUpdateRun) lost() int64 { return r.acked - r.final }

// isoLevels are the levels the workload's transactions are drawn from.
var isoLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// note counts a transaction at level that ended with err.
func (r *lostUpdateRun) note(level pgx.TxIsoLevel, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byLevel == nil {
		r.byLevel = map[pgx.TxIsoLevel]*[3]int64{}
	}
	c := r.byLevel[level]
	if c == nil {
		c = new([3]int64)
		r.byLevel[level] = c
	}
	switch {
	case err == nil:
		c[0]++
	case errors.Is(err, fence.ErrStale):
		c[1]++
	case errors.Is(err, postgres.ErrRetryable):
		c[2]++
	}
}

// levels says what each level's transactions ended as, and whether every
// level judged one.
func (r *lostUpdateRun) levels() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, all := "", true
	for _, l := range isoLevels {
		c := r.byLevel[l]
		if c == nil {
			c = new([3]int64)
		}
		all = all && c[0]+c[1]+c[2] > 0
		out += fmt.Sprintf("; %s: committed %d, stale %d, serialization failures %d", l, c[0], c[1], c[2])
	}
	return out[2:], all
}

// runIncrements runs the lock-set workload (after Jepsen's): workers, each
// a Locker of pglock.New of its own as a process would have, acquire the
// PostgreSQL lock, read a counter, sometimes pause past their lease, write the
// counter plus one and release. fenced: the read and the write pass the
// PostgreSQL guard (storage/postgres) with the lease's fence; otherwise
// they are plain statements under the lock alone. Nothing else: no Redis.
// Each transaction runs at an isolation level drawn for it; a
// serialization failure (the transaction rolled back) is a refusal.
func runIncrements(t *testing.T, pool *pgxpool.Pool, table string, fenced bool) *lostUpdateRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO `+table+` VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	const (
		workers = 4
		ops     = 12
		lease   = 150 * time.Millisecond
		pause   = 400 * time.Millisecond
	)
	var (
		run = &lostUpdateRun{}
		wg  sync.WaitGroup
	)
	inTx := func(rng *rand.Rand, f fence.Fence, fn func(ctx context.Context, tx pgx.Tx) error) error {
		level := isoLevels[rng.IntN(len(isoLevels))]
		opts := pgx.TxOptions{IsoLevel: level}
		if !fenced {
			err := pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error { return fn(ctx, tx) })
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") {
				// Rolled back, nothing changed: a refusal, as the guard's.
				err = fmt.Errorf("%w: %w", postgres.ErrRetryable, err)
			}
			return err
		}
		err := postgres.InTx(ctx, pool, opts, f, fn)
		run.note(level, err)
		return err
	}
	resource := "counter-" + table
	for w := range workers {
		l := newLocker(t, pool)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range ops {
				ls, err := l.Acquire(ctx, resource, lease)
				if err != nil {
					t.Error(err)
					return
				}
				f := ls.Fence()
				var n int64
				read := func(ctx context.Context, tx pgx.Tx) error {
					return tx.QueryRow(ctx, `SELECT n FROM `+table+` WHERE id = 1`).Scan(&n)
				}
				err = inTx(rng, f, read)
				if errors.Is(err, postgres.ErrRetryable) {
					atomic.AddInt64(&run.retryable, 1)
				}
				if errors.Is(err, fence.ErrStale) || errors.Is(err, postgres.ErrRetryable) {
					atomic.AddInt64(&run.refused, 1)
					_ = ls.Release(ctx)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rng.IntN(3) == 0 {
					// A pause past the lease: a GC, a swapped-out process.
					atomic.AddInt64(&run.paused, 1)
					time.Sleep(pause)
				}
				write := func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE `+table+` SET n = $1 WHERE id = 1`, n+1)
					return err
				}
				err = inTx(rng, f, write)
				switch {
				case errors.Is(err, fence.ErrStale):
					atomic.AddInt64(&run.refused, 1)
				case errors.Is(err, postgres.ErrRetryable):
					atomic.AddInt64(&run.refused, 1)
					atomic.AddInt64(&run.retryable, 1)
				case err != nil:
					t.Error(err)
					return
				default:
					atomic.AddInt64(&run.acked, 1)
				}
				_ = ls.Release(ctx)
			}
		}()
	}
	wg.Wait()
	if err := pool.QueryRow(ctx, `SELECT n FROM `+table+` WHERE id = 1`).Scan(&run.final); err != nil {
		t.Fatal(err)
	}
	return run
}

// TestNoLostUpdateOnPostgresAlone is the lost-update proof with nothing
// but PostgreSQL: the PostgreSQL lock's fence, admitted by the PostgreSQL
// guard, each transaction at READ COMMITTED, REPEATABLE READ or
// SERIALIZABLE, loses no acknowledged increment, while the same workload under
// the same lock without the guard loses some in the same run (the
// negative control, which shows the workload can see a loss).
func TestNoLostUpdateOnPostgresAlone(t *testing.T) {
	pool := migrated(t)
	fenced := runIncrements(t, pool, "fenced_counter", true)
	plain := runIncrements(t, pool, "plain_counter", false)
	levels, all := fenced.levels()
	t.Logf("fenced: %d acknowledged, %d refused (%d by a serialization failure), %d paused past the lease, final %d, lost %d; by isolation level: %s",
		fenced.acked, fenced.refused, fenced.retryable, fenced.paused, fenced.final, fenced.lost(), levels)
	if !all {
		t.Errorf("fenced: a level judged no transaction: %s", levels)
	}
	t.Logf("plain lock: %d acknowledged, %d paused past the lease, final %d, lost %d",
		plain.acked, plain.paused, plain.final, plain.lost())
	if fenced.lost() != 0 {
		t.Errorf("fenced: %d acknowledged increments lost", fenced.lost())
	}
	if fenced.acked < 10 || fenced.refused == 0 {
		t.Errorf("fenced: %d acknowledged, %d refused: the run judged too little", fenced.acked, fenced.refused)
	}
	if plain.lost() == 0 {
		t.Errorf("negative control: the plain lock lost nothing in %d increments (%d paused): the workload cannot see a loss", plain.acked, plain.paused)
	}
}
