package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	drv "github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// levels are the isolation levels the guard promises to work at.
var levels = []struct {
	name  string
	level sql.IsolationLevel
}{
	{"READ COMMITTED", sql.LevelReadCommitted},
	{"REPEATABLE READ", sql.LevelRepeatableRead},
	{"SERIALIZABLE", sql.LevelSerializable},
}

// isDeadlock reports whether err is the server's error 1213.
func isDeadlockT(err error) bool {
	var myErr *drv.MySQLError
	return errors.As(err, &myErr) && myErr.Number == 1213
}

// TestNewResourceRollbackWithTwoWaiters: T1 guards a resource that has no
// guard row yet and holds its transaction open, T2 and T3 (InTx) wait for
// the same resource, then T1 rolls back. InnoDB removes a row inserted by a
// transaction that rolls back and turns the waiters' row locks into gap
// locks; two waiters that then insert the row deadlock (error 1213). InTx
// creates the row in a statement of its own before its transaction, so
// both waiters get through, one after the other, at every isolation level:
// whether T1 is an InTx too (the row then exists before T1's transaction)
// or a Guard that inserted the row inside its own transaction.
func TestNewResourceRollbackWithTwoWaiters(t *testing.T) {
	for _, lv := range levels {
		for _, first := range []string{"InTx", "Guard"} {
			t.Run(lv.name+"/"+first, func(t *testing.T) {
				ctx, db := setup(t)
				opts := &sql.TxOptions{Isolation: lv.level}
				errHold := errors.New("test: T1 gives up")
				holding, release := make(chan struct{}), make(chan struct{})
				t1 := make(chan error, 1)
				f1 := fenceOf("new", 1, "T1")
				if first == "InTx" {
					go func() {
						t1 <- mysql.InTx(ctx, db, opts, f1, func(ctx context.Context, tx *sql.Tx) error {
							close(holding)
							<-release
							return errHold
						})
					}()
				} else {
					tx, _ := begin(t, ctx, db, lv.level)
					if err := mysql.Guard(ctx, tx, f1); err != nil {
						t.Fatal(err)
					}
					close(holding)
					go func() {
						<-release
						_ = tx.Rollback()
						t1 <- errHold
					}()
				}
				<-holding
				errs := make(chan error, 2)
				for _, tok := range []int64{2, 3} {
					go func() {
						errs <- mysql.InTx(ctx, db, opts, fenceOf("new", tok, fmt.Sprint("T", tok)), func(context.Context, *sql.Tx) error {
							return nil
						})
					}()
				}
				// Both waiters must wait on the row before T1 rolls back.
				waitLockWaits(t, ctx, db, 2)
				close(release)
				if err := <-t1; !errors.Is(err, errHold) {
					t.Fatalf("T1 = %v, want its own error", err)
				}
				for range 2 {
					err := <-errs
					if isDeadlockT(err) {
						t.Fatalf("a waiter was chosen as a deadlock victim: %v", err)
					}
					// The one that comes second may be stale (token 2 after 3).
					if err != nil && !errors.Is(err, fence.ErrStale) {
						t.Fatalf("waiter: %v", err)
					}
				}
				if m := mark(t, ctx, db, "new"); m.Token < 2 {
					t.Fatalf("mark %v, want a waiter's fence", m)
				}
			})
		}
	}
}

// waitLockWaits polls until n transactions of the test's database wait on
// a row lock, failing t after a deadline.
func waitLockWaits(t testing.TB, ctx context.Context, db *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waits int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&waits)
		if err != nil {
			t.Fatalf("INNODB_TRX: %v", err)
		}
		if waits >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d transactions wait on a lock after 20s, want %d", waits, n)
		}
		// INNODB_TRX refreshes only when nobody read it for 100 ms.
		time.Sleep(150 * time.Millisecond)
	}
}

// guardStress counts the outcomes of one stress run.
type guardStress struct {
	commits, stale, rolledBack, deadlocks, timeouts atomic.Int64
}

func (st *guardStress) String() string {
	return fmt.Sprintf("%d commits, %d stale, %d rolled back on purpose, %d deadlocks, %d lock wait timeouts",
		st.commits.Load(), st.stale.Load(), st.rolledBack.Load(), st.deadlocks.Load(), st.timeouts.Load())
}

// stressDuration is how long each stress run lasts: short in the normal
// run, FENCEKIT_SOAK (a duration such as 30s) when set.
func stressDuration(t *testing.T) time.Duration {
	if s := os.Getenv("FENCEKIT_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("FENCEKIT_SOAK=%q: %v", s, err)
		}
		return d
	}
	return 700 * time.Millisecond
}

// errGiveUp is what a stress transaction returns to roll back on purpose.
var errGiveUp = errors.New("test: rolled back on purpose")

// stressMinTxns is the least number of transactions a stress run makes,
// and stressCap how long it may go on past its duration to make them: an
// idle machine makes several hundred in the default 700ms, a loaded one
// (beside other test binaries) as few as 19, one in four of them a
// rollback, so a run of a fixed length could make too few to both commit
// and roll back. The run is a count of transactions, not a speed.
const (
	stressMinTxns = 100
	stressCap     = 30 * time.Second
)

// runGuardStress runs 8 workers for d, and on until they have made
// stressMinTxns transactions, both committed and rolled back (for at most
// stressCap more), each running transactions that fence 2 to 4 resources,
// about half of them never used before (each new one is picked by about
// six transactions, so several wait for the one that inserts its row); one
// transaction in four rolls back on purpose after its guards. txn runs one
// transaction; the stress counts what it returns.
func runGuardStress(ctx context.Context, t *testing.T, d time.Duration, txn func(ctx context.Context, fences []fence.Fence, giveUp bool) error) *guardStress {
	const workers = 8
	var st guardStress
	var fresh, token atomic.Int64
	stop := time.Now().Add(d)
	limit := stop.Add(stressCap)
	more := func() bool {
		now := time.Now()
		if now.Before(stop) {
			return true
		}
		c, r := st.commits.Load(), st.rolledBack.Load()
		enough := c > 0 && r > 0 && c+r+st.stale.Load()+st.deadlocks.Load()+st.timeouts.Load() >= stressMinTxns
		return !enough && now.Before(limit)
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			holder := fmt.Sprint("w", w)
			for more() {
				n := 2 + rng.IntN(3)
				seen := map[string]bool{}
				var fences []fence.Fence
				for len(fences) < n {
					r := fmt.Sprint("old-", rng.IntN(16))
					if rng.IntN(2) == 0 {
						r = fmt.Sprint("new-", fresh.Add(1)/6)
					}
					if !seen[r] {
						seen[r] = true
						fences = append(fences, fenceOf(r, token.Add(1), holder))
					}
				}
				err := txn(ctx, fences, rng.IntN(4) == 0)
				var myErr *drv.MySQLError
				switch {
				case err == nil:
					st.commits.Add(1)
				case errors.Is(err, errGiveUp):
					st.rolledBack.Add(1)
				case errors.Is(err, fence.ErrStale):
					st.stale.Add(1)
				case isDeadlockT(err):
					st.deadlocks.Add(1)
				case errors.As(err, &myErr) && myErr.Number == 1205:
					st.timeouts.Add(1)
				default:
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("worker: %v", err)
	}
	if st.commits.Load() == 0 || st.rolledBack.Load() == 0 {
		t.Fatalf("%v: the stress must both commit and roll back (in %v and up to %v more)", &st, d, stressCap)
	}
	return &st
}

// guardAllTxn is a stress transaction through GuardAll on a transaction
// of the caller's, after CreateGuardRows when create is set.
func guardAllTxn(db *sql.DB, level sql.IsolationLevel, create bool) func(context.Context, []fence.Fence, bool) error {
	return func(ctx context.Context, fences []fence.Fence, giveUp bool) error {
		if create {
			resources := make([]string, len(fences))
			for i, f := range fences {
				resources[i] = f.Resource
			}
			if err := mysql.CreateGuardRows(ctx, db, resources...); err != nil {
				return err
			}
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		if err != nil {
			return err
		}
		if err := mysql.GuardAll(ctx, tx, fences...); err != nil {
			_ = tx.Rollback()
			return err
		}
		if giveUp {
			_ = tx.Rollback()
			return errGiveUp
		}
		return tx.Commit()
	}
}

// inTxTxn is a stress transaction through InTx on the first of the
// fences (InTx guards one resource).
func inTxTxn(db *sql.DB, level sql.IsolationLevel) func(context.Context, []fence.Fence, bool) error {
	return func(ctx context.Context, fences []fence.Fence, giveUp bool) error {
		f := fences[0]
		return mysql.InTx(ctx, db, &sql.TxOptions{Isolation: level}, f, func(ctx context.Context, tx *sql.Tx) error {
			if giveUp {
				return errGiveUp
			}
			return nil
		})
	}
}

// TestGuardRowsStressNoDeadlocks runs the stress at each isolation level,
// through InTx and through GuardAll after CreateGuardRows, and counts
// deadlocks and lock wait timeouts on guard rows: there must be none.
// FENCEKIT_SOAK=30s makes each run last that long.
func TestGuardRowsStressNoDeadlocks(t *testing.T) {
	d := stressDuration(t)
	for _, lv := range levels {
		for _, call := range []string{"InTx", "CreateGuardRows+GuardAll"} {
			t.Run(lv.name+"/"+call, func(t *testing.T) {
				ctx, db := setup(t)
				db.SetMaxOpenConns(16)
				txn := inTxTxn(db, lv.level)
				if call != "InTx" {
					txn = guardAllTxn(db, lv.level, true)
				}
				st := runGuardStress(ctx, t, d, txn)
				t.Logf("%s, %s: %v in %v or more", lv.name, call, st, d)
				if st.deadlocks.Load() != 0 || st.timeouts.Load() != 0 {
					t.Errorf("%v: want no deadlock and no lock wait timeout", st)
				}
			})
		}
	}
}

// TestGuardAllInsertingRowsCanDeadlock is the stress's control: GuardAll on
// resources without guard rows inserts them inside the transaction, and a
// transaction that rolls back such a row while two others wait for it
// makes one of them a deadlock victim, as GuardAll's documentation says.
// The short run only reports the count; with FENCEKIT_SOAK it must see one.
func TestGuardAllInsertingRowsCanDeadlock(t *testing.T) {
	d := stressDuration(t)
	ctx, db := setup(t)
	db.SetMaxOpenConns(16)
	st := runGuardStress(ctx, t, d, guardAllTxn(db, sql.LevelRepeatableRead, false))
	t.Logf("REPEATABLE READ, GuardAll inserting rows: %v in %v or more", st, d)
	if os.Getenv("FENCEKIT_SOAK") != "" && st.deadlocks.Load() == 0 {
		t.Errorf("%v: the control saw no deadlock", st)
	}
}

// TestGuardRowsNeedMigration3: on a guard table from before migration 3,
// whose check refuses a row with no mark, InTx and CreateGuardRows say
// that the migrations are missing, and change nothing.
func TestGuardRowsNeedMigration3(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := context.Background()
	p, err := goose.NewProvider(goose.DialectMySQL, db, migrations.MySQLFS,
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	err = mysql.InTx(ctx, db, nil, fenceOf("r", 1, "h"), func(context.Context, *sql.Tx) error { return nil })
	if !errors.Is(err, mysql.ErrNotMigrated) {
		t.Fatalf("InTx = %v, want ErrNotMigrated", err)
	}
	if err := mysql.CreateGuardRows(ctx, db, "r"); !errors.Is(err, mysql.ErrNotMigrated) {
		t.Fatalf("CreateGuardRows = %v, want ErrNotMigrated", err)
	}
	if m := mark(t, ctx, db, "r"); m.Token != 0 {
		t.Fatalf("mark %v, want none", m)
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := mysql.CreateGuardRows(ctx, db, "r", "s", "r"); err != nil {
		t.Fatal(err)
	}
	if m := mark(t, ctx, db, "r"); m.Token != 0 {
		t.Fatalf("mark of a created row %v, want none", m)
	}
	raise(t, ctx, db, fenceOf("r", 1, "h"))
	if m := mark(t, ctx, db, "r"); m != fenceOf("r", 1, "h") {
		t.Fatalf("mark %v, want the fence admitted", m)
	}
}
