package pglock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// lostUpdateRun is what one run of the increment workload saw.
type lostUpdateRun struct {
	acked, refused, final, paused int64
}

func (r lostUpdateRun) lost() int64 { return r.acked - r.final }

// runIncrements runs the lock-set workload (after Jepsen's): workers, each
// a Locker of pglock.New of its own as a process would have, acquire the
// PostgreSQL lock, read a counter, sometimes pause past their lease, write the
// counter plus one and release. fenced: the read and the write pass the
// PostgreSQL guard (storage/postgres) with the lease's fence; otherwise
// they are plain statements under the lock alone. Nothing else: no Redis.
func runIncrements(t *testing.T, pool *pgxpool.Pool, table string, fenced bool) lostUpdateRun {
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
		run lostUpdateRun
		wg  sync.WaitGroup
	)
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
				if fenced {
					err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, read)
				} else {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return read(ctx, tx) })
				}
				if errors.Is(err, fence.ErrStale) {
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
				if fenced {
					err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, write)
				} else {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx) })
				}
				switch {
				case errors.Is(err, fence.ErrStale):
					atomic.AddInt64(&run.refused, 1)
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
// guard, loses no acknowledged increment, while the same workload under
// the same lock without the guard loses some in the same run (the
// negative control, which shows the workload can see a loss).
func TestNoLostUpdateOnPostgresAlone(t *testing.T) {
	pool := migrated(t)
	fenced := runIncrements(t, pool, "fenced_counter", true)
	plain := runIncrements(t, pool, "plain_counter", false)
	t.Logf("fenced: %d acknowledged, %d refused as stale, %d paused past the lease, final %d, lost %d",
		fenced.acked, fenced.refused, fenced.paused, fenced.final, fenced.lost())
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
