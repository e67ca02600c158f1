package fencekit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestMySQLDailyJobOnceDespiteLostReplies runs a nightly job (a payout that
// is not idempotent by itself) for a number of days, three instances racing
// for each day's lock, against MariaDB through a network that loses the
// reply to about every other job's COMMIT. An instance that gets any error
// other than a stale refusal runs the job again under a new lease, as a job
// runner does when it cannot tell that the work is done. With mysql.Once
// every day has exactly one payout. The negative control runs the same job
// fenced but without the completion record, and pays some days twice.
func TestMySQLDailyJobOnceDespiteLostReplies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	const days, instances, attempts = 12, 3, 20
	run := func(t *testing.T, withOnce bool) (perDay map[string]int, lost int) {
		cfg := testenv.MySQLConfig(t)
		direct := testenv.OpenMySQL(t, cfg)
		ctx := context.Background()
		if err := migrations.UpMySQL(ctx, direct); err != nil {
			t.Fatal(err)
		}
		if _, err := direct.ExecContext(ctx, `CREATE TABLE payouts (id BIGINT AUTO_INCREMENT PRIMARY KEY, day VARCHAR(16) NOT NULL, token BIGINT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, cfg.Addr)
		pcfg := cfg.Clone()
		pcfg.Addr = p.Addr()
		db := testenv.OpenMySQL(t, pcfg)
		db.SetMaxIdleConns(0)
		locker := sharedLocker(t)
		var mu sync.Mutex
		for d := range days {
			day := fmt.Sprintf("2033-01-%02d", d+1)
			var wg sync.WaitGroup
			for range instances {
				wg.Go(func() {
					for range attempts {
						actx, cancel := context.WithTimeout(ctx, 10*time.Second)
						lease, err := locker.Acquire(actx, "payout:"+day, 2*time.Second)
						if err != nil {
							cancel()
							t.Errorf("acquire: %v", err)
							return
						}
						f := lease.Fence()
						job := func(ctx context.Context, tx *sql.Tx) error {
							if _, err := tx.ExecContext(ctx, `INSERT INTO payouts (day, token) VALUES (?, ?)`, day, int64(f.Token)); err != nil {
								return err
							}
							if rand.IntN(2) == 0 {
								p.LoseNextReply(nil) // most likely the reply to this COMMIT
							}
							return nil
						}
						if withOnce {
							_, err = mysql.Once(actx, db, f, "payout:"+day, job)
						} else {
							err = mysql.InTx(actx, db, nil, f, job)
						}
						_ = lease.Release(context.WithoutCancel(actx))
						cancel()
						if errors.Is(err, fence.ErrOutcomeUnknown) {
							mu.Lock()
							lost++
							mu.Unlock()
						}
						if err == nil || errors.Is(err, fence.ErrStale) {
							return
						}
						// Not known to be done: run it again under a new lease.
					}
					if withOnce {
						t.Errorf("%s: an instance gave up after %d attempts", day, attempts)
					}
				})
			}
			wg.Wait()
		}
		perDay = map[string]int{}
		rows, err := direct.QueryContext(ctx, `SELECT day, COUNT(*) FROM payouts GROUP BY day`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var day string
			var n int
			if err := rows.Scan(&day, &n); err != nil {
				t.Fatal(err)
			}
			perDay[day] = n
		}
		return perDay, lost
	}

	perDay, lost := run(t, true)
	if lost == 0 {
		t.Fatal("no COMMIT reply was lost: the run did not exercise the fault")
	}
	if len(perDay) != days {
		t.Fatalf("%d of %d days paid: %v", len(perDay), days, perDay)
	}
	for day, n := range perDay {
		if n != 1 {
			t.Errorf("%s paid %d times with Once, want 1", day, n)
		}
	}
	t.Logf("with Once: %d days paid once each, %d unknown outcomes retried", days, lost)

	perDay, lost = run(t, false)
	twice := 0
	for _, n := range perDay {
		if n > 1 {
			twice++
		}
	}
	if twice == 0 {
		t.Fatalf("negative control paid no day twice (%v): the test cannot see a duplicate", perDay)
	}
	t.Logf("negative control (fenced, no completion record): %d of %d days paid more than once, %d unknown outcomes", twice, days, lost)
}
