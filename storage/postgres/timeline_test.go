package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// The timeline of DESIGN.md section 3, run step by step. A holds token 1,
// reads, and pauses past its lease; B is granted token 2, reads, and both
// then write read+1. Each read and each write is its own transaction, as
// they would be for a holder that does not keep a transaction open while it
// works.
type timeline struct {
	read  func(f fence.Fence) (int64, error)
	write func(f fence.Fence, n int64) error
}

// run plays the timeline and returns how many increments were acknowledged
// and A's write error.
func (tl timeline) run(t *testing.T) (acked int, errA error) {
	t.Helper()
	a := fenceOf("counter", 1, "A")
	b := fenceOf("counter", 2, "B")
	readA, err := tl.read(a)
	if err != nil {
		t.Fatalf("A's read: %v", err)
	}
	// A pauses here; its lease expires and B is granted token 2.
	readB, err := tl.read(b)
	if err != nil {
		t.Fatalf("B's read: %v", err)
	}
	// A wakes up and writes what it computed before the pause.
	errA = tl.write(a, readA+1)
	if errA == nil {
		acked++
	}
	if err := tl.write(b, readB+1); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	acked++
	return acked, errA
}

func TestTimelineFencedReadsLoseNothing(t *testing.T) {
	ctx, pool := setup(t)
	tl := timeline{
		read: func(f fence.Fence) (n int64, err error) {
			err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				n, _ = counter(t, ctx, tx)
				return nil
			})
			return n, err
		},
		write: func(f fence.Fence, n int64) error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE counter SET n = $1, writer = $2 WHERE id = 1`, n, int64(f.Token))
				return err
			})
		},
	}
	acked, errA := tl.run(t)
	wantStale(t, errA, fenceOf("counter", 2, "B"))
	n, writer := counter(t, ctx, pool)
	if int64(acked) != n {
		t.Fatalf("%d increments acknowledged, counter is %d: an increment was lost", acked, n)
	}
	if writer != 2 {
		t.Fatalf("last writer = token %d, want B's token 2", writer)
	}
}

// Negative control: the same timeline with plain reads and writes must lose
// B's or A's increment, or this test could not see a loss at all.
func TestTimelinePlainLosesAnIncrement(t *testing.T) {
	ctx, pool := setup(t)
	tl := timeline{
		read: func(fence.Fence) (int64, error) {
			n, _ := counter(t, ctx, pool)
			return n, nil
		},
		write: func(f fence.Fence, n int64) error {
			_, err := pool.Exec(ctx, `UPDATE counter SET n = $1, writer = $2 WHERE id = 1`, n, int64(f.Token))
			return err
		},
	}
	acked, errA := tl.run(t)
	if errA != nil {
		t.Fatalf("plain write refused: %v", errA)
	}
	n, _ := counter(t, ctx, pool)
	if int64(acked) == n {
		t.Fatalf("negative control saw no loss: %d acknowledged, counter %d", acked, n)
	}
}

// Negative control: fencing only the writes is not enough (DESIGN.md
// section 3): A's write (token 1) is admitted over an empty mark, then B's
// (token 2) too, and A's increment is lost.
func TestTimelineFencedWritesOnlyLoseAnIncrement(t *testing.T) {
	ctx, pool := setup(t)
	tl := timeline{
		read: func(fence.Fence) (int64, error) {
			n, _ := counter(t, ctx, pool)
			return n, nil
		},
		write: func(f fence.Fence, n int64) error {
			_, err := postgres.Exec(ctx, pool, f, postgres.Statement{
				SQL:  `UPDATE counter SET n = $1, writer = $2 WHERE id = 1`,
				Args: []any{n, int64(f.Token)},
			})
			return err
		},
	}
	acked, errA := tl.run(t)
	if errA != nil {
		t.Fatalf("A's fenced write over an empty mark was refused: %v", errA)
	}
	n, _ := counter(t, ctx, pool)
	if int64(acked) == n {
		t.Fatalf("unfenced reads lost nothing: %d acknowledged, counter %d", acked, n)
	}
}

// A holder that pauses inside its fenced transaction keeps the guard row
// locked: the next holder waits for it and then reads its increment.
func TestTimelinePauseInsideTransaction(t *testing.T) {
	ctx, pool := setup(t)
	paused := make(chan struct{})
	resume := make(chan struct{})
	doneA := make(chan error, 1)
	go func() {
		doneA <- postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("counter", 1, "A"), func(ctx context.Context, tx pgx.Tx) error {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
				return err
			}
			close(paused)
			<-resume
			_, err := tx.Exec(ctx, `UPDATE counter SET n = $1 WHERE id = 1`, n+1)
			return err
		})
	}()
	<-paused
	cb := acquire(t, ctx, pool)
	doneB := make(chan error, 1)
	go func() {
		doneB <- postgres.InTx(ctx, cb, pgx.TxOptions{}, fenceOf("counter", 2, "B"), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
			return err
		})
	}()
	waitBlocked(t, ctx, pool, cb.Conn().PgConn().PID())
	close(resume)
	if err := <-doneA; err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-doneB; err != nil {
		t.Fatalf("B: %v", err)
	}
	if n, _ := counter(t, ctx, pool); n != 2 {
		t.Fatalf("counter = %d, want 2", n)
	}
}

// A workload after Jepsen's lock-set: workers take a lock (a one-slot
// semaphore handing out ever newer tokens), do a fenced read, pause, and do
// a fenced write of read+1. A third of the leases "expire" during the pause:
// the lock is handed on while the old holder still writes. Every
// acknowledged increment must be in the final value, and the tokens of
// admitted writes must never decrease.
func TestWorkloadFencedNoLostIncrement(t *testing.T) {
	ctx, pool := setup(t)
	var next atomic.Int64
	var acked atomic.Int64
	var mu sync.Mutex
	var admitted []int64 // tokens of committed writes, in commit order
	lock := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for range 10 {
				lock <- struct{}{}
				held := true
				release := func() {
					if held {
						held = false
						<-lock
					}
				}
				f := fenceOf("counter", next.Add(1), fence.NewHolder())
				var n int64
				err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
					return tx.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n)
				})
				if errors.Is(err, fence.ErrStale) {
					release()
					continue
				}
				if err != nil {
					release()
					t.Errorf("worker %d read: %v", w, err)
					return
				}
				if rand.IntN(3) == 0 {
					release() // the lease expires during the pause
				}
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // the pause under test
				err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE counter SET n = $1, writer = $2 WHERE id = 1`, n+1, int64(f.Token))
					if err == nil {
						// Recorded while the guard row is locked, so the
						// order is the commit order of admitted writes.
						mu.Lock()
						admitted = append(admitted, int64(f.Token))
						mu.Unlock()
					}
					return err
				})
				release()
				switch {
				case err == nil:
					acked.Add(1)
				case !errors.Is(err, fence.ErrStale):
					t.Errorf("worker %d write: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, _ := counter(t, ctx, pool)
	if n != acked.Load() {
		t.Fatalf("%d increments acknowledged, counter is %d", acked.Load(), n)
	}
	if acked.Load() == 0 {
		t.Fatal("no write was admitted")
	}
	for i := 1; i < len(admitted); i++ {
		if admitted[i] < admitted[i-1] {
			t.Fatalf("admitted tokens decreased: %v", admitted)
		}
	}
	t.Logf("%d of %d writes admitted", acked.Load(), next.Load())
}
