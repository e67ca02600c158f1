package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	mysqlstore "github.com/fencekit/fencekit/storage/mysql"
)

// lostUpdateRun is what one run of the increment workload saw.
type lostUpdateRun struct {
	acked, refused, final, paused int64
	retryable                     int64 // refused by a deadlock or a lock wait timeout

	mu      sync.Mutex
	byLevel map[string]*[3]int64 // isolation level -> fenced transactions committed, stale, retryable
}

// isoLevels are the levels the workload's transactions are drawn from.
var isoLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// note counts a transaction at level that ended with err.
func (r *lostUpdateRun) note(level sql.IsolationLevel, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byLevel == nil {
		r.byLevel = map[string]*[3]int64{}
	}
	c := r.byLevel[level.String()]
	if c == nil {
		c = new([3]int64)
		r.byLevel[level.String()] = c
	}
	switch {
	case err == nil:
		c[0]++
	case errors.Is(err, fence.ErrStale):
		c[1]++
	case errors.Is(err, mysqlstore.ErrRetryable):
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
		c := r.byLevel[l.String()]
		if c == nil {
			c = new([3]int64)
		}
		all = all && c[0]+c[1]+c[2] > 0
		out += fmt.Sprintf("; %s: committed %d, stale %d, serialization failures %d", l, c[0], c[1], c[2])
	}
	return out[2:], all
}

func (r *lostUpdateRun) lost() int64 { return r.acked - r.final }

// runIncrements runs the lock-set workload: workers, each a Locker of New
// of its own, acquire the MySQL lock, read a counter, sometimes pause past
// their lease, write the counter plus one and release. fenced: the read
// and the write pass storage/mysql's guard with the lease's fence;
// otherwise they are plain transactions under the lock alone. Each
// transaction runs at an isolation level drawn for it; a deadlock or lock
// wait timeout (the transaction rolled back) is a refusal.
func runIncrements(t *testing.T, db *sql.DB, table string, fenced bool) *lostUpdateRun {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO `+table+` VALUES (1, 0)`); err != nil {
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
	resource := "counter-" + table
	inTx := func(rng *rand.Rand, f fence.Fence, fn mysqlstore.TxFunc) error {
		level := isoLevels[rng.IntN(len(isoLevels))]
		opts := &sql.TxOptions{Isolation: level}
		if fenced {
			err := mysqlstore.InTx(ctx, db, opts, f, fn)
			run.note(level, err)
			return err
		}
		err := func() error {
			tx, err := db.BeginTx(ctx, opts)
			if err != nil {
				return err
			}
			if err := fn(ctx, tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}()
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockWaitTimeout) {
			// Rolled back, nothing changed: a refusal, as the guard's.
			err = fmt.Errorf("%w: %w", mysqlstore.ErrRetryable, err)
		}
		return err
	}
	for w := range workers {
		l := newLocker(t, db)
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
				err = inTx(rng, f, func(ctx context.Context, tx *sql.Tx) error {
					return tx.QueryRowContext(ctx, `SELECT n FROM `+table+` WHERE id = 1`).Scan(&n)
				})
				if errors.Is(err, mysqlstore.ErrRetryable) {
					atomic.AddInt64(&run.retryable, 1)
				}
				if errors.Is(err, fence.ErrStale) || errors.Is(err, mysqlstore.ErrRetryable) {
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
				err = inTx(rng, f, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `UPDATE `+table+` SET n = ? WHERE id = 1`, n+1)
					return err
				})
				switch {
				case errors.Is(err, fence.ErrStale):
					atomic.AddInt64(&run.refused, 1)
				case errors.Is(err, mysqlstore.ErrRetryable):
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
	if err := db.QueryRowContext(ctx, `SELECT n FROM `+table+` WHERE id = 1`).Scan(&run.final); err != nil {
		t.Fatal(err)
	}
	return run
}

// TestNoLostUpdateOnMySQLAlone is the lost-update proof with nothing but
// MariaDB: the MySQL lock's fence, admitted by storage/mysql's guard, each
// transaction at READ COMMITTED, REPEATABLE READ or SERIALIZABLE, loses
// no acknowledged increment, while the same workload under the same
// lock without the guard loses some (the negative control).
func TestNoLostUpdateOnMySQLAlone(t *testing.T) {
	t.Parallel() // mostly pauses past the lease
	db := migrated(t)
	fenced := runIncrements(t, db, "fenced_counter", true)
	plain := runIncrements(t, db, "plain_counter", false)
	levels, all := fenced.levels()
	t.Logf("fenced: %d acknowledged, %d refused (%d by a deadlock or lock wait timeout), %d paused past the lease, final %d, lost %d; by isolation level: %s",
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

// TestElectionOnMySQL: the election runs unchanged on a Locker of New:
// Campaign, Leader, Observe, Proclaim, Resign handing over to the next
// candidate, and the deposed leader's write refused by storage/mysql.
func TestElectionOnMySQL(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, time.Minute)
	ea, err := election.New(newLocker(t, db), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := election.New(newLocker(t, db), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ea.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader before any term = %v, want ErrNoLeader", err)
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	seen := eb.Observe(obsCtx)
	a, err := ea.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := eb.Leader(ctx); err != nil || l.Value != "node-a" || l.Token != a.Fence().Token {
		t.Fatalf("Leader = %+v, %v; want node-a with token %d", l, err, a.Fence().Token)
	}
	next := func(want string) election.Leader {
		t.Helper()
		for {
			select {
			case l := <-seen:
				if l.Value == want {
					return l
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the observer never saw %s", want)
			}
		}
	}
	la := next("node-a")
	if err := a.Proclaim(ctx, "node-a:v2"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	next("node-a:v2")
	bTerm := make(chan *election.Term, 1)
	go func() {
		b, err := eb.Campaign(ctx, "node-b")
		if err != nil {
			t.Error(err)
		}
		bTerm <- b
	}()
	waitFor(t, func() bool {
		var c int
		_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM fencekit_lock_waiter`).Scan(&c)
		return c == 1
	})
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-bTerm
	if b == nil {
		return
	}
	lb := next("node-b")
	if lb.Token <= la.Token || b.Fence().Token != lb.Token {
		t.Fatalf("terms seen %+v then %+v; want increasing tokens, the second b's (%d)", la, lb, b.Fence().Token)
	}
	write := func(f fence.Fence) error {
		return mysqlstore.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil })
	}
	if err := write(b.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := write(a.Fence()); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the deposed leader's write = %v, want fence.ErrStale", err)
	}
	if err := a.Proclaim(ctx, "node-a:v3"); err == nil {
		t.Fatal("the deposed leader proclaimed")
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMovedFromRedisAdmitted: a resource locked first on Redis, whose
// fence storage/mysql admitted, is admitted again when its lock moves to
// MySQL: the MySQL lock's tokens start above the Redis lock's.
func TestMovedFromRedisAdmitted(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 30*time.Second)
	rl, err := lock.New(testenv.Redis(t), lock.WithPrefix("fktest:mysqllock:"+fence.NewHolder()[:12]+":"))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	write := func(f fence.Fence) error {
		return mysqlstore.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil })
	}
	lr, err := rl.TryAcquire(ctx, "moved", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(lr.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := lr.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lm, err := newLocker(t, db).TryAcquire(ctx, "moved", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lm.Fence().Token <= lr.Fence().Token {
		t.Fatalf("MySQL token %d not above the Redis lock's %d", lm.Fence().Token, lr.Fence().Token)
	}
	if err := write(lm.Fence()); err != nil {
		t.Fatalf("the MySQL lock's fence after the Redis lock's: %v", err)
	}
	if err := write(lr.Fence()); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the Redis lock's older fence = %v, want fence.ErrStale", err)
	}
	_ = lm.Release(ctx)
}
