package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// work is a Once body that counts its runs in the counter row, the data the
// work protects; calls counts how often it was called at all.
type work struct {
	mu    sync.Mutex
	calls int
}

func (w *work) fn(ctx context.Context, tx pgx.Tx) error {
	w.mu.Lock()
	w.calls++
	w.mu.Unlock()
	_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
	return err
}

func (w *work) called() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}

func wantRecord(t *testing.T, ctx context.Context, db postgres.Querier, key string, f fence.Fence) postgres.OnceRecord {
	t.Helper()
	rec, err := postgres.LookupOnce(ctx, db, key)
	if err != nil {
		t.Fatalf("LookupOnce(%q): %v", key, err)
	}
	if rec.Key != key || rec.Resource != f.Resource || rec.Token != f.Token || rec.HolderMark != fence.HolderMark(f.Holder) {
		t.Fatalf("record = %+v, want key %q run under %v (holder mark %s)", rec, key, f, fence.HolderMark(f.Holder))
	}
	// The row keeps the holder's mark, never the holder id.
	var holder string
	if err := db.QueryRow(ctx, "SELECT holder FROM fencekit_once WHERE key = $1", key).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != fence.HolderMark(f.Holder) {
		t.Fatalf("fencekit_once.holder = %q, want the mark %q of %q", holder, fence.HolderMark(f.Holder), f.Holder)
	}
	return rec
}

func wantNoRecord(t *testing.T, ctx context.Context, db postgres.Querier, key string) {
	t.Helper()
	if rec, err := postgres.LookupOnce(ctx, db, key); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("LookupOnce(%q) = %+v, %v; want ErrNotFound", key, rec, err)
	}
}

// A key's work commits once: the same fence again, a newer fence of the
// same resource, and another resource's fence all find it done, without
// calling fn. The record names the fence that ran it.
func TestOnceRunsAKeyOnce(t *testing.T) {
	ctx, pool := setup(t)
	var w work
	first := fenceOf("job", 1, "a")
	before := time.Now()
	for i, f := range []fence.Fence{first, first, fenceOf("job", 2, "b"), fenceOf("other-job", 1, "c")} {
		ran, err := postgres.Once(ctx, pool, f, "daily:2026-11-23", w.fn)
		if err != nil {
			t.Fatalf("call %d with %v: %v", i, f, err)
		}
		if ran != (i == 0) {
			t.Fatalf("call %d with %v: ran = %v, want %v", i, f, ran, i == 0)
		}
	}
	if n, _ := counter(t, ctx, pool); n != 1 || w.called() != 1 {
		t.Fatalf("work applied %d times, fn called %d times; want once each", n, w.called())
	}
	rec := wantRecord(t, ctx, pool, "daily:2026-11-23", first)
	// The server's clock against ours: only a sanity bound.
	if d := rec.Done.Sub(before); d < -time.Minute || d > time.Minute {
		t.Fatalf("record time %v, %v from the call", rec.Done, d)
	}
	// The later fences' guards were admitted reads: their marks committed.
	if got := mark(t, ctx, pool, "job"); got != fenceOf("job", 2, "b") {
		t.Fatalf("mark = %v, want the newer fence's", got)
	}
	// Another key is other work.
	if ran, err := postgres.Once(ctx, pool, fenceOf("job", 2, "b"), "daily:2026-11-24", w.fn); err != nil || !ran {
		t.Fatalf("another key: ran = %v, err = %v; want it run", ran, err)
	}
}

// fn's error rolls back the work and the record: the key runs later.
func TestOnceFnErrorRecordsNothing(t *testing.T) {
	ctx, pool := setup(t)
	boom := errors.New("boom")
	f := fenceOf("job", 1, "a")
	ran, err := postgres.Once(ctx, pool, f, "k", func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		return boom
	})
	if ran || !errors.Is(err, boom) {
		t.Fatalf("ran = %v, err = %v; want false and fn's error", ran, err)
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, fn's work committed", n)
	}
	wantNoRecord(t, ctx, pool, "k")
	var w work
	if ran, err := postgres.Once(ctx, pool, f, "k", w.fn); err != nil || !ran {
		t.Fatalf("rerun: ran = %v, err = %v; want it run", ran, err)
	}
	wantRecord(t, ctx, pool, "k", f)
}

// fn's panic rolls back the work and the record, returns the connection and
// continues with its own value; the key runs later.
func TestOncePanicRecordsNothing(t *testing.T) {
	ctx, pool := leakSetup(t)
	want := panicValue{"Once"}
	f := fenceOf("job", 1, "a")
	got := recovered(func() {
		_, _ = postgres.Once(ctx, pool, f, "k", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
				return err
			}
			panic(want)
		})
	})
	wantPanic(t, got, want)
	wantAllReturned(t, pool)
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, the panicking work committed", n)
	}
	wantNoRecord(t, ctx, pool, "k")
	var w work
	if ran, err := postgres.Once(ctx, pool, fenceOf("job", 2, "b"), "k", w.fn); err != nil || !ran {
		t.Fatalf("next holder: ran = %v, err = %v; want it run", ran, err)
	}
}

// A stale fence is refused without running fn, done or not.
func TestOnceStale(t *testing.T) {
	ctx, pool := setup(t)
	var w work
	newer := fenceOf("job", 5, "b")
	raise(t, ctx, pool, newer)
	for _, key := range []string{"not-done", "done"} {
		if key == "done" {
			if ran, err := postgres.Once(ctx, pool, newer, key, w.fn); err != nil || !ran {
				t.Fatalf("newer holder: ran = %v, err = %v", ran, err)
			}
		}
		before := w.called()
		ran, err := postgres.Once(ctx, pool, fenceOf("job", 4, "a"), key, w.fn)
		if ran || w.called() != before {
			t.Fatalf("%s: stale fence ran fn", key)
		}
		wantStale(t, err, newer)
	}
	wantNoRecord(t, ctx, pool, "not-done")
}

// The COMMIT's reply is lost and the connection cut: Once says the outcome
// is unknown, the work did commit, and calling Once again (on a new
// connection, under the same fence) finds it done instead of applying it
// twice. When the reply lost is one before COMMIT, nothing committed, Once
// does not say unknown, and the next call runs the work.
func TestOnceAfterLostReply(t *testing.T) {
	f := fenceOf("job", 1, "a")
	t.Run("COMMIT's reply", func(t *testing.T) {
		ctx, pool := setup(t)
		p, conn := proxied(t, ctx, pool)
		var w work
		var recorded atomic.Bool
		ran, err := postgres.Once(ctx, conn, f, "k", func(ctx context.Context, tx pgx.Tx) error {
			if err := w.fn(ctx, tx); err != nil {
				return err
			}
			p.LoseNextReply(func() {
				// The server ran COMMIT; its reply is about to be dropped.
				_, err := postgres.LookupOnce(context.Background(), pool, "k")
				recorded.Store(err == nil)
			})
			return nil
		})
		if ran || !errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("ran = %v, err = %v; want false and an unknown outcome", ran, err)
		}
		if !recorded.Load() {
			t.Fatal("the record was not committed when COMMIT's reply came back")
		}
		_, conn = proxied(t, ctx, pool)
		ran, err = postgres.Once(ctx, conn, f, "k", w.fn)
		if ran || err != nil {
			t.Fatalf("retry: ran = %v, err = %v; want false, nil: the work is done", ran, err)
		}
		if n, _ := counter(t, ctx, pool); n != 1 || w.called() != 1 {
			t.Fatalf("work applied %d times, fn called %d times; want once each", n, w.called())
		}
		wantRecord(t, ctx, pool, "k", f)
	})
	t.Run("a reply before COMMIT", func(t *testing.T) {
		ctx, pool := setup(t)
		p, conn := proxied(t, ctx, pool)
		var w work
		ran, err := postgres.Once(ctx, conn, f, "k", func(ctx context.Context, tx pgx.Tx) error {
			p.LoseNextReply(nil) // the reply to fn's statement
			return w.fn(ctx, tx)
		})
		if ran || err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("ran = %v, err = %v; want false and an error that is not an unknown outcome", ran, err)
		}
		wantNoRecord(t, ctx, pool, "k")
		_, conn = proxied(t, ctx, pool)
		if ran, err := postgres.Once(ctx, conn, f, "k", w.fn); err != nil || !ran {
			t.Fatalf("retry: ran = %v, err = %v; want the work run", ran, err)
		}
		if n, _ := counter(t, ctx, pool); n != 1 {
			t.Fatalf("work applied %d times, want once", n)
		}
	})
}

// Ten instances race for one key, with fences of one resource (tokens 1 to
// 10) and with fences of ten resources: exactly one runs the work; every
// other returns ran = false or a stale refusal, and the record names the
// winner.
func TestOnceRaceOfTen(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("one resource %v", shared), func(t *testing.T) {
			ctx, pool := setup(t)
			cfg := pool.Config()
			cfg.MaxConns = 12
			wide, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer wide.Close()
			type result struct {
				f   fence.Fence
				ran bool
				err error
			}
			results := make(chan result, 10)
			start := make(chan struct{})
			var w work
			for i := range 10 {
				f := fenceOf("job", int64(i+1), fmt.Sprintf("holder-%d", i))
				if !shared {
					f.Resource = fmt.Sprintf("job-%d", i)
				}
				go func() {
					<-start
					ran, err := postgres.Once(ctx, wide, f, "daily", func(ctx context.Context, tx pgx.Tx) error {
						// Hold the transaction a little, so that rivals arrive
						// while it is open.
						if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.02)`); err != nil {
							return err
						}
						return w.fn(ctx, tx)
					})
					results <- result{f, ran, err}
				}()
			}
			close(start)
			var winners []fence.Fence
			var done, stale int
			for range 10 {
				r := <-results
				switch {
				case r.err == nil && r.ran:
					winners = append(winners, r.f)
				case r.err == nil:
					done++
				case errors.Is(r.err, fence.ErrStale) && shared:
					// Only rivals on one resource can be refused: each
					// other resource's mark sees one fence.
					stale++
				default:
					t.Errorf("%v: %v", r.f, r.err)
				}
			}
			t.Logf("ran: %d, found it done: %d, refused as stale: %d", len(winners), done, stale)
			if len(winners) != 1 {
				t.Fatalf("%d instances ran the work (%v), want exactly one", len(winners), winners)
			}
			if n, _ := counter(t, ctx, pool); n != 1 || w.called() != 1 {
				t.Fatalf("work applied %d times, fn called %d times; want once each", n, w.called())
			}
			wantRecord(t, ctx, pool, "daily", winners[0])
		})
	}
}

// On a pgx.Tx, Once runs in a savepoint: its record commits, or not, with
// the caller's transaction.
func TestOnceInCallersTransaction(t *testing.T) {
	ctx, pool := setup(t)
	var w work
	f := fenceOf("job", 1, "a")
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ran, err := postgres.Once(ctx, tx, f, "k", w.fn); err != nil || !ran {
			t.Fatalf("in a transaction: ran = %v, err = %v", ran, err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := counter(t, ctx, pool); n != 1 {
		t.Fatalf("n = %d, want only the committed transaction's work", n)
	}
	wantRecord(t, ctx, pool, "k", f)
}

// Deleting a record lets the key's work run again, as documented.
func TestOnceRecordDeleted(t *testing.T) {
	ctx, pool := setup(t)
	var w work
	f := fenceOf("job", 1, "a")
	if ran, err := postgres.Once(ctx, pool, f, "k", w.fn); err != nil || !ran {
		t.Fatalf("ran = %v, err = %v", ran, err)
	}
	mustExec(t, ctx, pool, `DELETE FROM fencekit_once WHERE done_at < now() + interval '1 minute'`)
	if ran, err := postgres.Once(ctx, pool, f, "k", w.fn); err != nil || !ran {
		t.Fatalf("after deleting the record: ran = %v, err = %v; want the work run again", ran, err)
	}
	if n, _ := counter(t, ctx, pool); n != 2 {
		t.Fatalf("n = %d, want 2", n)
	}
}

// Bad input is refused before anything is sent.
func TestOnceRefusesBadInput(t *testing.T) {
	var nilCtx context.Context
	f := fenceOf("job", 1, "a")
	nop := func(context.Context, pgx.Tx) error { return nil }
	cases := map[string]func(db *recorder) error{
		"empty key": func(db *recorder) error { _, err := postgres.Once(context.Background(), db, f, "", nop); return err },
		"NUL in key": func(db *recorder) error {
			_, err := postgres.Once(context.Background(), db, f, "a\x00b", nop)
			return err
		},
		"invalid UTF-8": func(db *recorder) error {
			_, err := postgres.Once(context.Background(), db, f, "\xff\xfe", nop)
			return err
		},
		"long key": func(db *recorder) error {
			_, err := postgres.Once(context.Background(), db, f, strings.Repeat("k", postgres.MaxOnceKeyLen+1), nop)
			return err
		},
		"nil fn":      func(db *recorder) error { _, err := postgres.Once(context.Background(), db, f, "k", nil); return err },
		"nil context": func(db *recorder) error { _, err := postgres.Once(nilCtx, db, f, "k", nop); return err },
		"nil db":      func(*recorder) error { _, err := postgres.Once(context.Background(), nil, f, "k", nop); return err },
		"invalid fence": func(db *recorder) error {
			_, err := postgres.Once(context.Background(), db, fenceOf("job", 0, "a"), "k", nop)
			return err
		},
		"LookupOnce empty key": func(db *recorder) error { _, err := postgres.LookupOnce(context.Background(), db, ""); return err },
		"LookupOnce NUL in key": func(db *recorder) error {
			_, err := postgres.LookupOnce(context.Background(), db, "a\x00b")
			return err
		},
	}
	for name, call := range cases {
		refusedUnsent(t, name, fence.ErrInvalid, call)
	}
}

// Without the completion table, Once and LookupOnce say the migrations are
// missing.
func TestOnceNotMigrated(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `DROP TABLE fencekit_once`)
	var w work
	if _, err := postgres.Once(ctx, pool, fenceOf("job", 1, "a"), "k", w.fn); !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("Once = %v, want ErrNotMigrated", err)
	}
	if _, err := postgres.LookupOnce(ctx, pool, "k"); !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("LookupOnce = %v, want ErrNotMigrated", err)
	}
	if w.called() != 0 {
		t.Fatal("fn ran without a completion table")
	}
}

// The negative control for TestOnceRaceOfTen: the same ten instances on ten
// resources, each checking a done table before doing the work, as code
// without a completion record keyed on the work does. Fences do not stop
// them (each resource's mark sees one fence), so the work runs more than
// once: the race is real, and Once is what prevents the duplicates.
func TestOnceRaceControlWithoutTheRecord(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE done (key text, resource text)`)
	cfg := pool.Config()
	cfg.MaxConns = 12
	wide, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	var w work
	var wg sync.WaitGroup
	start, allChecked := make(chan struct{}), make(chan struct{})
	var checked sync.WaitGroup
	checked.Add(10)
	go func() { checked.Wait(); close(allChecked) }()
	for i := range 10 {
		f := fenceOf(fmt.Sprintf("job-%d", i), 1, "h")
		wg.Go(func() {
			<-start
			err := postgres.InTx(ctx, wide, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				var n int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM done WHERE key = 'daily'`).Scan(&n); err != nil || n > 0 {
					return err
				}
				// Every instance checks before any records: the race made
				// certain however the machine schedules the ten.
				checked.Done()
				select {
				case <-allChecked:
				case <-time.After(5 * time.Second):
				}
				if err := w.fn(ctx, tx); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO done VALUES ('daily', $1)`, f.Resource)
				return err
			})
			if err != nil {
				t.Errorf("%v: %v", f, err)
			}
		})
	}
	close(start)
	wg.Wait()
	n, _ := counter(t, ctx, pool)
	t.Logf("without the record the work ran %d times", n)
	if n < 2 {
		t.Fatalf("the work ran %d times without the record: the race did not happen, so TestOnceRaceOfTen shows nothing", n)
	}
}
