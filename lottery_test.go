package fencekit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
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
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
	"github.com/fencekit/fencekit/storage/pgsql"
	"github.com/fencekit/fencekit/storage/postgres"
)

// lotteryDB is a fresh database for one run of the lottery scenario.
type lotteryDB struct {
	// proxy carries every connection of draw.
	proxy *testenv.Proxy
	// draw records a draw for day under f: through Once with the key
	// "lottery-draw:<day>", or fenced (InTx) without the completion record.
	// beforeCommit runs last inside the transaction.
	draw func(ctx context.Context, f fence.Fence, day string, withOnce bool, beforeCommit func()) error
	// draws counts the stored draws per day, read directly.
	draws func(t *testing.T) map[string]int
}

const lotteryTable = `CREATE TABLE lottery_draws (id BIGINT PRIMARY KEY %s, day VARCHAR(16) NOT NULL, token BIGINT NOT NULL)`

func lotteryPostgres(t *testing.T) lotteryDB {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	direct, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	if err := migrations.Up(ctx, direct); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.ExecContext(ctx, fmt.Sprintf(lotteryTable, "GENERATED ALWAYS AS IDENTITY")); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(p.Addr())
	pn, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(pn)
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return lotteryDB{
		proxy: p,
		draw: func(ctx context.Context, f fence.Fence, day string, withOnce bool, beforeCommit func()) error {
			work := func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO lottery_draws (day, token) VALUES ($1, $2)`, day, int64(f.Token)); err != nil {
					return err
				}
				beforeCommit()
				return nil
			}
			if withOnce {
				_, err := postgres.Once(ctx, pool, f, "lottery-draw:"+day, work)
				return err
			}
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, work)
		},
		draws: func(t *testing.T) map[string]int { return countDraws(t, direct) },
	}
}

// lotteryPgsql is lotteryPostgres through database/sql (pgx's stdlib) and
// storage/pgsql.
func lotteryPgsql(t *testing.T) lotteryDB {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	direct, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	if err := migrations.Up(ctx, direct); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.ExecContext(ctx, fmt.Sprintf(lotteryTable, "GENERATED ALWAYS AS IDENTITY")); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, _ := net.SplitHostPort(p.Addr())
	pn, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(pn), nil
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return lotteryDB{
		proxy: p,
		draw: func(ctx context.Context, f fence.Fence, day string, withOnce bool, beforeCommit func()) error {
			work := func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO lottery_draws (day, token) VALUES ($1, $2)`, day, int64(f.Token)); err != nil {
					return err
				}
				beforeCommit()
				return nil
			}
			if withOnce {
				_, err := pgsql.Once(ctx, db, f, "lottery-draw:"+day, work)
				return err
			}
			return pgsql.InTx(ctx, db, nil, f, work)
		},
		draws: func(t *testing.T) map[string]int { return countDraws(t, direct) },
	}
}

func lotteryMySQL(t *testing.T) lotteryDB {
	ctx := context.Background()
	cfg := testenv.MySQLConfig(t)
	direct := testenv.OpenMySQL(t, cfg)
	if err := migrations.UpMySQL(ctx, direct); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.ExecContext(ctx, fmt.Sprintf(lotteryTable, "AUTO_INCREMENT")); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, cfg.Addr)
	pcfg := cfg.Clone()
	pcfg.Addr = p.Addr()
	db := testenv.OpenMySQL(t, pcfg)
	return lotteryDB{
		proxy: p,
		draw: func(ctx context.Context, f fence.Fence, day string, withOnce bool, beforeCommit func()) error {
			work := func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO lottery_draws (day, token) VALUES (?, ?)`, day, int64(f.Token)); err != nil {
					return err
				}
				beforeCommit()
				return nil
			}
			if withOnce {
				_, err := mysql.Once(ctx, db, f, "lottery-draw:"+day, work)
				return err
			}
			return mysql.InTx(ctx, db, nil, f, work)
		},
		draws: func(t *testing.T) map[string]int { return countDraws(t, direct) },
	}
}

func countDraws(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT day, COUNT(*) FROM lottery_draws GROUP BY day`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	perDay := map[string]int{}
	for rows.Next() {
		var day string
		var n int
		if err := rows.Scan(&day, &n); err != nil {
			t.Fatal(err)
		}
		perDay[day] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return perDay
}

// lotteryRun is what one run of the scenario saw.
type lotteryRun struct {
	perDay map[string]int // stored draws per day
	lost   int            // draws whose outcome was unknown (a lost reply)
	stale  int            // paused instances refused as stale
}

// runLottery is the lottery workload of examples/lottery, under faults. For
// each day, instances race for the day's lock; each checks the day's done
// mark in Redis (what a job sets once it knows its draw committed) and, if
// it is not set, draws and then sets it. The first lock winner of a day
// pauses after its check, past its lease, until every other instance of the
// day has finished. About every other draw loses the reply to its COMMIT
// (the proxy drops it after the server ran it), and an instance that does
// not know its draw committed draws again under a new lease, as a job
// runner does.
func runLottery(t *testing.T, db lotteryDB, withOnce bool) lotteryRun {
	const days, instances, attempts, ttl = 6, 5, 20, 400 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	locker, err := lock.New(client, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Close)
	var lost, stale atomic.Int64
	for d := range days {
		day := fmt.Sprintf("2034-02-%02d", d+1)
		done := prefix + "drawn:" + day
		var pauser atomic.Bool
		var finished atomic.Int64
		othersDone := make(chan struct{})
		var wg sync.WaitGroup
		for i := range instances {
			wg.Go(func() {
				paused := false
				defer func() {
					if !paused && finished.Add(1) == instances-1 {
						close(othersDone)
					}
				}()
				for attempt := range attempts {
					lease, err := locker.Acquire(ctx, "lottery:"+day, ttl)
					if err != nil {
						t.Errorf("%s: instance %d: acquire: %v", day, i, err)
						return
					}
					f := lease.Fence()
					release := func() { _ = lease.Release(context.WithoutCancel(ctx)) }
					if n, err := client.Exists(ctx, done).Result(); err != nil || n == 1 {
						release()
						if err != nil {
							t.Errorf("%s: done mark: %v", day, err)
						}
						return
					}
					if attempt == 0 && pauser.CompareAndSwap(false, true) {
						paused = true
						time.Sleep(ttl + ttl/4)
						select {
						case <-othersDone:
						case <-ctx.Done():
							t.Errorf("%s: the paused instance waited for the others until %v", day, ctx.Err())
							release()
							return
						}
					}
					err = db.draw(ctx, f, day, withOnce, func() {
						if d == 0 && attempt == 0 || rand.IntN(2) == 0 {
							db.proxy.LoseNextReply(nil) // most likely the reply to this COMMIT
						}
					})
					if err == nil {
						// Marked before the lease goes, so that the next
						// holder sees it.
						if err := client.Set(ctx, done, int64(f.Token), 0).Err(); err != nil {
							t.Errorf("%s: done mark: %v", day, err)
						}
					}
					release()
					switch {
					case err == nil:
						return
					case errors.Is(err, fence.ErrStale):
						if paused {
							stale.Add(1)
						}
						return // a newer holder took over: it draws or finds the day drawn
					case errors.Is(err, fence.ErrOutcomeUnknown):
						lost.Add(1)
					}
					// Not known to be drawn: draw again under a new lease.
				}
				if withOnce {
					t.Errorf("%s: an instance gave up after %d attempts", day, attempts)
				}
			})
		}
		wg.Wait()
	}
	return lotteryRun{perDay: db.draws(t), lost: int(lost.Load()), stale: int(stale.Load())}
}

// TestLotteryOnceDespitePauseAndLostReplies is the end-to-end suite's
// lottery scenario (examples/lottery under faults): five instances race for
// each day's draw, the first lock winner pauses past its lease, and COMMIT
// replies are lost. With Once every day is drawn exactly once on PostgreSQL
// and on MySQL, and every paused instance is refused as stale. The negative
// control runs the same workload fenced but without the completion record:
// a draw whose reply was lost is drawn again, and the days hold duplicates
// (in our runs, one per lost reply).
func TestLotteryOnceDespitePauseAndLostReplies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	for _, store := range []struct {
		name string
		open func(*testing.T) lotteryDB
	}{{"postgres", lotteryPostgres}, {"pgsql", lotteryPgsql}, {"mysql", lotteryMySQL}} {
		t.Run(store.name, func(t *testing.T) {
			withOnce := runLottery(t, store.open(t), true)
			if withOnce.lost == 0 {
				t.Fatal("no COMMIT reply was lost: the run did not exercise the fault")
			}
			dup := 0
			for day, n := range withOnce.perDay {
				if n != 1 {
					dup += n - 1
					t.Errorf("%s drawn %d times with Once, want 1", day, n)
				}
			}
			if len(withOnce.perDay) != 6 || withOnce.stale != 6 {
				t.Fatalf("with Once: %d of 6 days drawn, %d of 6 paused instances refused as stale: %v", len(withOnce.perDay), withOnce.stale, withOnce.perDay)
			}
			t.Logf("with Once: %d duplicate draws over 6 days, %d lost COMMIT replies, %d paused instances refused", dup, withOnce.lost, withOnce.stale)

			control := runLottery(t, store.open(t), false)
			dup = 0
			for _, n := range control.perDay {
				dup += n - 1
			}
			if dup == 0 {
				t.Fatalf("negative control drew no day twice (%v, %d lost replies): the test cannot see a duplicate", control.perDay, control.lost)
			}
			t.Logf("negative control (fenced, no completion record): %d duplicate draws over 6 days, %d lost COMMIT replies, %d paused instances refused", dup, control.lost, control.stale)
		})
	}
}
