package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// work is the unit that Once must commit at most once: a row per run in
// table work, so that a second run shows as a second row.
func work(key string, runs *int) mysql.TxFunc {
	return func(ctx context.Context, tx *sql.Tx) error {
		*runs++
		_, err := tx.ExecContext(ctx, `INSERT INTO work (k) VALUES (?)`, key)
		return err
	}
}

func setupWork(t *testing.T, ctx context.Context, db *sql.DB) {
	t.Helper()
	mustExec(t, ctx, db, `CREATE TABLE work (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL)`)
}

func workRows(t *testing.T, ctx context.Context, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM work WHERE k = ?`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestOnceRunsOnce(t *testing.T) {
	for _, parseTime := range []bool{false, true} {
		t.Run(fmt.Sprintf("parseTime=%v", parseTime), func(t *testing.T) {
			cfg := testenv.MySQLConfig(t)
			cfg.ParseTime = parseTime
			ctx, db := setupWith(t, cfg)
			setupWork(t, ctx, db)
			runs := 0
			before := time.Now().UTC().Add(-time.Minute)
			f := fenceOf("nightly", 3, "h1")
			ran, err := mysql.Once(ctx, db, f, "2031-01-01", work("2031-01-01", &runs))
			if err != nil || !ran {
				t.Fatalf("first Once = %v, %v; want ran", ran, err)
			}
			// A newer holder, and the same one again, find the work done.
			for _, g := range []fence.Fence{fenceOf("nightly", 4, "h2"), fenceOf("nightly", 4, "h2")} {
				ran, err = mysql.Once(ctx, db, g, "2031-01-01", work("2031-01-01", &runs))
				if err != nil || ran {
					t.Fatalf("Once for a done key = %v, %v; want not run", ran, err)
				}
			}
			if runs != 1 || workRows(t, ctx, db, "2031-01-01") != 1 {
				t.Fatalf("fn ran %d times, %d work rows; want 1 and 1", runs, workRows(t, ctx, db, "2031-01-01"))
			}
			// The newer holder's guard committed although the work was done.
			if got := mark(t, ctx, db, "nightly"); got != fenceOf("nightly", 4, "h2") {
				t.Fatalf("mark = %v, want the newer holder's", got)
			}
			rec, err := mysql.LookupOnce(ctx, db, "2031-01-01")
			if err != nil {
				t.Fatal(err)
			}
			if rec.Key != "2031-01-01" || rec.Resource != f.Resource || rec.Token != f.Token || rec.HolderMark != fence.HolderMark(f.Holder) || rec.Done.Before(before) || rec.Done.After(time.Now().UTC().Add(time.Minute)) || rec.Done.Location() != time.UTC {
				t.Fatalf("record %+v, want key 2031-01-01 under %v (holder mark %s) done about now, in UTC", rec, f, fence.HolderMark(f.Holder))
			}
			// The row keeps the holder's mark, never the holder id.
			var holder string
			if err := db.QueryRowContext(ctx, "SELECT holder FROM fencekit_once WHERE `key` = ?", "2031-01-01").Scan(&holder); err != nil || holder != fence.HolderMark(f.Holder) {
				t.Fatalf("fencekit_once.holder = %q, %v; want the mark %q", holder, err, fence.HolderMark(f.Holder))
			}
			if _, err := mysql.LookupOnce(ctx, db, "2031-01-02"); !errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("LookupOnce of an undone key = %v, want ErrNotFound", err)
			}
			// Deleting the record lets the key run again.
			mustExec(t, ctx, db, "DELETE FROM fencekit_once WHERE `key` = ?", "2031-01-01")
			if ran, err := mysql.Once(ctx, db, fenceOf("nightly", 5, "h3"), "2031-01-01", work("2031-01-01", &runs)); err != nil || !ran {
				t.Fatalf("Once after deleting the record = %v, %v; want ran", ran, err)
			}
		})
	}
}

func TestOnceFailureRecordsNothing(t *testing.T) {
	ctx, db := setup(t)
	setupWork(t, ctx, db)
	boom := errors.New("boom")
	runs := 0
	ran, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), "k", func(ctx context.Context, tx *sql.Tx) error {
		if err := work("k", &runs)(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || ran {
		t.Fatalf("Once = %v, %v; want fn's error", ran, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panic in fn" {
				t.Fatalf("recovered %v, want fn's panic", r)
			}
		}()
		_, _ = mysql.Once(ctx, db, fenceOf("r", 1, "h"), "k", func(ctx context.Context, tx *sql.Tx) error {
			_ = work("k", &runs)(ctx, tx)
			panic("panic in fn")
		})
	}()
	if n := workRows(t, ctx, db, "k"); n != 0 {
		t.Fatalf("%d work rows after a failed and a panicking run, want 0", n)
	}
	if _, err := mysql.LookupOnce(ctx, db, "k"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("record after failures: %v, want none", err)
	}
	if inUse := db.Stats().InUse; inUse != 0 {
		t.Fatalf("%d connections in use after a panic, want 0", inUse)
	}
	if ran, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), "k", work("k", &runs)); err != nil || !ran {
		t.Fatalf("Once after failures = %v, %v; want ran", ran, err)
	}
	if n := workRows(t, ctx, db, "k"); n != 1 {
		t.Fatalf("%d work rows, want 1", n)
	}
}

func TestOnceStaleRunsNothing(t *testing.T) {
	ctx, db := setup(t)
	setupWork(t, ctx, db)
	raise(t, ctx, db, fenceOf("r", 5, "new"))
	runs := 0
	ran, err := mysql.Once(ctx, db, fenceOf("r", 4, "old"), "k", work("k", &runs))
	wantStale(t, err, fenceOf("r", 5, "new"))
	if ran || runs != 0 {
		t.Fatalf("stale Once ran=%v, fn ran %d times; want nothing", ran, runs)
	}
}

func TestOnceBadInput(t *testing.T) {
	conn := &refusingConnector{}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	for name, call := range map[string]func() error{
		"empty key": func() error { _, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), "", noop); return err },
		"long key": func() error {
			_, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), strings.Repeat("k", mysql.MaxOnceKeyLen+1), noop)
			return err
		},
		"NUL key":    func() error { _, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), "k\x00", noop); return err },
		"nil fn":     func() error { _, err := mysql.Once(ctx, db, fenceOf("r", 1, "h"), "k", nil); return err },
		"nil db":     func() error { _, err := mysql.Once(ctx, nil, fenceOf("r", 1, "h"), "k", noop); return err },
		"zero fence": func() error { _, err := mysql.Once(ctx, db, fence.Fence{}, "k", noop); return err },
		"lookup key": func() error { _, err := mysql.LookupOnce(ctx, db, ""); return err },
	} {
		if err := call(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if n := conn.dials.Load(); n != 0 {
		t.Fatalf("%d connection attempts for bad input, want 0", n)
	}
}

// TestOnceLostCommitReplyThenRetry loses the answer to Once's COMMIT: the
// call cannot tell whether the work committed and says so. Calling Once
// again tells the truth: the work committed, so it is not run twice.
func TestOnceLostCommitReplyThenRetry(t *testing.T) {
	ctx, db, direct, p := proxied(t)
	setupWork(t, ctx, direct)
	runs := 0
	f := fenceOf("nightly", 1, "h")
	ran, err := mysql.Once(ctx, db, f, "k", func(ctx context.Context, tx *sql.Tx) error {
		if err := work("k", &runs)(ctx, tx); err != nil {
			return err
		}
		p.LoseNextReply(nil) // the next answer is COMMIT's
		return nil
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Once = %v, %v; want ErrOutcomeUnknown", ran, err)
	}
	ran, err = mysql.Once(ctx, db, f, "k", work("k", &runs))
	if err != nil || ran {
		t.Fatalf("retried Once = %v, %v; want ran=false: the work committed", ran, err)
	}
	if n := workRows(t, ctx, direct, "k"); n != 1 || runs != 1 {
		t.Fatalf("%d work rows, fn ran %d times; want 1 and 1", n, runs)
	}
}

// TestOnceCommitNeverArrivesThenRetry holds Once's COMMIT in the network
// until the call's context ends, then cuts the connection so that the
// server never sees the COMMIT and rolls back. The call reports an unknown
// outcome; calling Once again finds no record and runs the work.
func TestOnceCommitNeverArrivesThenRetry(t *testing.T) {
	ctx, db, direct, p := proxied(t)
	setupWork(t, ctx, direct)
	runs := 0
	f := fenceOf("nightly", 1, "h")
	callCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ran, err := mysql.Once(callCtx, db, f, "k", func(ctx context.Context, tx *sql.Tx) error {
		if err := work("k", &runs)(ctx, tx); err != nil {
			return err
		}
		p.Block()
		return nil
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Once = %v, %v; want ErrOutcomeUnknown", ran, err)
	}
	p.CutAll() // the held COMMIT is dropped with the connection
	p.Unblock()
	ran, err = mysql.Once(ctx, db, f, "k", work("k", &runs))
	if err != nil || !ran {
		t.Fatalf("retried Once = %v, %v; want ran=true: the first COMMIT never arrived", ran, err)
	}
	if n := workRows(t, ctx, direct, "k"); n != 1 {
		t.Fatalf("%d work rows, want 1", n)
	}
}

// TestOnceRaceOfTen starts ten instances on one key at once, each with a
// fence of its own resource (ten locks that know nothing of each other),
// and then ten more sharing one resource with random tokens. Exactly one
// commits the work each time. The negative control checks for the work
// inside the fenced transaction instead of using Once, and runs it more
// than once.
func TestOnceRaceOfTen(t *testing.T) {
	const instances = 10
	race := func(t *testing.T, ctx context.Context, db *sql.DB, key string, fenceFor func(i int) fence.Fence, withOnce bool) (ran, stale int) {
		t.Helper()
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range instances {
			wg.Go(func() {
				<-start
				runs := 0
				var didRun bool
				err := mysql.Retry(ctx, 0, func(ctx context.Context) error {
					var err error
					if withOnce {
						didRun, err = mysql.Once(ctx, db, fenceFor(i), key, work(key, &runs))
						return err
					}
					didRun = false
					return mysql.InTx(ctx, db, nil, fenceFor(i), func(ctx context.Context, tx *sql.Tx) error {
						var n int
						if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM work WHERE k = ?`, key).Scan(&n); err != nil || n > 0 {
							return err
						}
						didRun = true
						return work(key, &runs)(ctx, tx)
					})
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, fence.ErrStale):
					stale++
				case err != nil:
					t.Errorf("instance %d: %v", i, err)
				case didRun:
					ran++
				}
			})
		}
		close(start)
		wg.Wait()
		return ran, stale
	}
	ctx, db := setup(t)
	setupWork(t, ctx, db)
	ownResource := func(i int) fence.Fence { return fenceOf(fmt.Sprintf("lock-%d", i), 1, "h") }
	if ran, _ := race(t, ctx, db, "own", ownResource, true); ran != 1 || workRows(t, ctx, db, "own") != 1 {
		t.Fatalf("own resources: %d instances ran, %d work rows; want 1 and 1", ran, workRows(t, ctx, db, "own"))
	}
	tokens := rand.Perm(instances)
	shared := func(i int) fence.Fence { return fenceOf("nightly", int64(tokens[i]+1), fmt.Sprint("h", i)) }
	ran, stale := race(t, ctx, db, "shared", shared, true)
	if ran != 1 || workRows(t, ctx, db, "shared") != 1 {
		t.Fatalf("shared resource: %d instances ran (%d stale), %d work rows; want 1 and 1", ran, stale, workRows(t, ctx, db, "shared"))
	}
	t.Logf("shared resource: 1 ran, %d refused as stale, %d found the work done", stale, instances-1-stale)

	// Negative control: a check for the work inside the fenced transaction,
	// under locks that know nothing of each other.
	for range 5 {
		key := fmt.Sprint("control-", rand.Int())
		if ran, _ := race(t, ctx, db, key, ownResource, false); ran > 1 {
			t.Logf("negative control: %d instances ran the work, %d rows", ran, workRows(t, ctx, db, key))
			return
		}
	}
	t.Fatal("the check-then-run control never ran the work twice: the test cannot see a duplicate")
}

// TestLookupOnceInAnOlderSnapshot: a REPEATABLE READ transaction (and a
// read-only one) that read before a Once committed still sees that Once's
// record through LookupOnce, and a lookup of a key whose Once is in flight
// waits for its outcome rather than report it missing.
func TestLookupOnceInAnOlderSnapshot(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("read-only=", readOnly), func(t *testing.T) {
			ctx, db := setup(t)
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: readOnly})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			counter(t, ctx, tx) // the snapshot is taken here
			f := fenceOf("job", 1, "h")
			if ran, err := mysql.Once(ctx, db, f, "k", func(context.Context, *sql.Tx) error { return nil }); err != nil || !ran {
				t.Fatalf("Once = %v, %v", ran, err)
			}
			rec, err := mysql.LookupOnce(ctx, tx, "k")
			if err != nil || rec.Token != f.Token || rec.HolderMark != fence.HolderMark(f.Holder) {
				t.Fatalf("LookupOnce in the older snapshot = %+v, %v; want the record of %v", rec, err, f)
			}
		})
	}
	t.Run("in flight", func(t *testing.T) {
		ctx, db := setup(t)
		inside, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := mysql.Once(ctx, db, fenceOf("job", 1, "h"), "k", func(context.Context, *sql.Tx) error {
				close(inside)
				<-release
				return nil
			})
			done <- err
		}()
		<-inside
		looked := make(chan error, 1)
		go func() { _, err := mysql.LookupOnce(ctx, db, "k"); looked <- err }()
		select {
		case err := <-looked:
			t.Fatalf("LookupOnce answered %v while the Once was in flight", err)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := <-looked; err != nil {
			t.Fatalf("LookupOnce after the Once committed = %v", err)
		}
	})
}
