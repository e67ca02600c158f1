package pgsqlsuite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
	"github.com/fencekit/fencekit/storage/postgres"
)

func init() {
	register(
		test{"GuardFirstLosesNothingAtEveryLevel", testGuardFirstEveryLevel},
		test{"ReadBeforeGuardLosesAnUpdate", testReadBeforeGuard},
		test{"PanicRollsBackAndReturnsConnection", testPanic},
		test{"BadInputSendsNothing", testBadInputSendsNothing},
		test{"ZeroFenceNamesTheCall", testZeroFenceMessages},
		test{"OneMarkWithStoragePostgres", testSharedWithPostgres},
		test{"Once", testOnce},
		test{"RetryableAtRepeatableRead", testRetryableAtRepeatableRead},
	)
}

var levels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// testGuardFirstEveryLevel interleaves two fenced increments so that the
// newer holder arrives while the older one's transaction is open: the
// newer one waits on the guard row and, at every isolation level (retrying
// the serialization failures of REPEATABLE READ and SERIALIZABLE), counts
// on top of the older one's committed write. Two increments acknowledged,
// two counted.
func testGuardFirstEveryLevel(t *testing.T, d Driver) {
	for _, level := range levels {
		t.Run(level.String(), func(t *testing.T) {
			e := setup(t, d)
			opts := &sql.TxOptions{Isolation: level}
			inA := make(chan int64, 1)
			release := make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				aDone <- pgsql.InTx(e.ctx, e.db, opts, fenceOf("r", 1, "a"), func(ctx context.Context, tx *sql.Tx) error {
					var p int64
					if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
						return err
					}
					inA <- p
					<-release // B arrives now
					return increment(ctx, tx)
				})
			}()
			var aPID int64
			select {
			case aPID = <-inA:
			case err := <-aDone:
				t.Fatalf("A: %v", err)
			}
			var attempts atomic.Int32
			bDone := make(chan error, 1)
			go func() {
				bDone <- pgsql.Retry(e.ctx, 0, func(ctx context.Context) error {
					attempts.Add(1)
					return pgsql.InTx(ctx, e.db, opts, fenceOf("r", 2, "b"), increment)
				})
			}()
			e.waitBlockedBy(aPID)
			close(release)
			if err := <-aDone; err != nil {
				t.Fatalf("A: %v", err)
			}
			if err := <-bDone; err != nil {
				t.Fatalf("B: %v", err)
			}
			if n := e.counter(); n != 2 {
				t.Fatalf("counter = %d after two acknowledged increments, want 2 (a lost update)", n)
			}
			t.Logf("%s: B ran %d time(s)", level, attempts.Load())
		})
	}
}

// testReadBeforeGuard is the negative control: the older holder reads
// before its guard, the newer holder's whole increment lands in between,
// and the older holder's guard (with a token newer still, as a lock that
// re-granted would give) is admitted. At READ COMMITTED its write is
// computed from the stale read: one increment is lost, which shows the
// tests above can see a loss. At REPEATABLE READ and SERIALIZABLE
// PostgreSQL itself refuses the stale transaction (40001).
func testReadBeforeGuard(t *testing.T, d Driver) {
	for _, level := range levels {
		t.Run(level.String(), func(t *testing.T) {
			e := setup(t, d)
			tx := e.begin(level)
			var n int64
			if err := tx.QueryRowContext(e.ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 2, "b"), increment); err != nil {
				t.Fatalf("B: %v", err)
			}
			err := pgsql.Guard(e.ctx, tx, fenceOf("r", 3, "a"))
			if err == nil {
				_, err = tx.ExecContext(e.ctx, `UPDATE counter SET n = $1 WHERE id = 1`, n+1)
			}
			if err == nil {
				err = tx.Commit()
			}
			got := e.counter()
			switch level {
			case sql.LevelReadCommitted:
				if err != nil || got != 1 {
					t.Fatalf("control: err %v, counter %d; want a lost update (nil, 1)", err, got)
				}
			default:
				if !errors.Is(err, pgsql.ErrRetryable) || got != 1 {
					t.Fatalf("control: err %v, counter %d; want ErrRetryable and 1", err, got)
				}
			}
		})
	}
}

// testRetryableAtRepeatableRead: a REPEATABLE READ transaction whose
// snapshot predates a rival's raise of the mark fails its guard with
// ErrRetryable, wrapping the driver's error.
func testRetryableAtRepeatableRead(t *testing.T, d Driver) {
	e := setup(t, d)
	e.raise(fenceOf("r", 1, "a"))
	tx := e.begin(sql.LevelRepeatableRead)
	_ = pid(t, e.ctx, tx) // takes the snapshot
	e.raise(fenceOf("r", 2, "b"))
	err := pgsql.Guard(e.ctx, tx, fenceOf("r", 3, "c"))
	var re *pgsql.RetryableError
	if !errors.Is(err, pgsql.ErrRetryable) || !errors.As(err, &re) || !strings.Contains(err.Error(), "40001") && !strings.Contains(err.Error(), "serialize") {
		t.Fatalf("Guard = %v, want ErrRetryable for a serialization failure", err)
	}
}

type panicValue struct{ n int }

// testPanic: a panic in fn rolls back (no mark, no write), returns the
// connection to the pool and continues with its own value; the next holder
// is admitted at once.
func testPanic(t *testing.T, d Driver) {
	e := setup(t, d)
	want := panicValue{7}
	got := func() (v any) {
		defer func() { v = recover() }()
		_ = pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 5, "a"), func(ctx context.Context, tx *sql.Tx) error {
			if err := increment(ctx, tx); err != nil {
				return err
			}
			panic(want)
		})
		return nil
	}()
	if got != want {
		t.Fatalf("recovered %v, want %v", got, want)
	}
	if s := e.db.Stats(); s.InUse != 0 {
		t.Fatalf("%d connections in use after the panic, want 0", s.InUse)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := pgsql.InTx(ctx, e.db, nil, fenceOf("r", 1, "b"), func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatalf("next holder after the panic: %v (the guard row must be free and unraised)", err)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d, want 0", n)
	}
	// Once too.
	got = func() (v any) {
		defer func() { v = recover() }()
		_, _ = pgsql.Once(e.ctx, e.db, fenceOf("r", 2, "b"), "k", func(context.Context, *sql.Tx) error { panic(want) })
		return nil
	}()
	if got != want {
		t.Fatalf("Once: recovered %v, want %v", got, want)
	}
	if _, err := pgsql.LookupOnce(e.ctx, e.db, "k"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("record after a panic: %v, want none", err)
	}
	if s := e.db.Stats(); s.InUse != 0 {
		t.Fatalf("%d connections in use after Once's panic, want 0", s.InUse)
	}
}

// countingConnector never connects and counts the tries: a call that sends
// nothing never asks for a connection.
type countingConnector struct{ tries atomic.Int32 }

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	c.tries.Add(1)
	return nil, errors.New("test: no connection")
}
func (c *countingConnector) Driver() driver.Driver { return nil }

// testBadInputSendsNothing: every entry point refuses bad input with
// fence.ErrInvalid without taking a connection.
func testBadInputSendsNothing(t *testing.T, d Driver) {
	cc := &countingConnector{}
	db := sql.OpenDB(cc)
	defer db.Close()
	ctx := context.Background()
	good := fenceOf("r", 1, "h")
	tbl := pgsql.Table{Name: "t", Key: "id"}
	noop := func(context.Context, *sql.Tx) error { return nil }
	var nilCtx context.Context
	var nilDB *sql.DB
	for name, call := range map[string]func() error{
		"InTx zero fence": func() error { return pgsql.InTx(ctx, db, nil, fence.Fence{}, noop) },
		"InTx nil fn":     func() error { return pgsql.InTx(ctx, db, nil, good, nil) },
		"InTx nil db":     func() error { return pgsql.InTx(ctx, nilDB, nil, good, noop) },
		"InTx nil ctx":    func() error { return pgsql.InTx(nilCtx, db, nil, good, noop) },
		"InTx read-only":  func() error { return pgsql.InTx(ctx, db, &sql.TxOptions{ReadOnly: true}, good, noop) },
		"InTx long resource": func() error {
			return pgsql.InTx(ctx, db, nil, fenceOf(strings.Repeat("r", fence.MaxResourceLen+1), 1, "h"), noop)
		},
		"InTx NUL holder": func() error { return pgsql.InTx(ctx, db, nil, fenceOf("r", 1, "a\x00b"), noop) },
		"Guard nil tx":    func() error { return pgsql.Guard(ctx, nil, good) },
		"GuardAll none":   func() error { return pgsql.GuardAll(ctx, &sql.Tx{}, []fence.Fence{}...) },
		"HighWater empty": func() error { _, err := pgsql.HighWater(ctx, db, ""); return err },
		"Once empty key":  func() error { _, err := pgsql.Once(ctx, db, good, "", noop); return err },
		"Once long key": func() error {
			_, err := pgsql.Once(ctx, db, good, strings.Repeat("k", pgsql.MaxOnceKeyLen+1), noop)
			return err
		},
		"Once zero fence":        func() error { _, err := pgsql.Once(ctx, db, fence.Fence{}, "k", noop); return err },
		"LookupOnce NUL":         func() error { _, err := pgsql.LookupOnce(ctx, db, "a\x00"); return err },
		"Update zero fence":      func() error { return tbl.Update(ctx, db, fence.Fence{}, 1) },
		"Update no key column":   func() error { return pgsql.Table{Name: "t"}.Update(ctx, db, good, 1) },
		"Update NUL name":        func() error { return pgsql.Table{Name: "t\x00", Key: "id"}.Update(ctx, db, good, 1) },
		"Update token is key":    func() error { return pgsql.Table{Name: "t", Key: "id", Token: "id"}.Update(ctx, db, good, 1) },
		"Update sets the token":  func() error { return tbl.Update(ctx, db, good, 1, pgsql.Set("fence_token", 1)) },
		"Upsert zero fence":      func() error { return tbl.Upsert(ctx, db, fence.Fence{}, 1) },
		"UpdateVersion NUL col":  func() error { _, err := tbl.UpdateVersion(ctx, db, 1, 1, pgsql.Set("a\x00", 1)); return err },
		"UpdateVersion sets ver": func() error { _, err := tbl.UpdateVersion(ctx, db, 1, 1, pgsql.Set("version", 1)); return err },
		"Retry negative":         func() error { return pgsql.Retry(ctx, -1, func(context.Context) error { return nil }) },
	} {
		err := call()
		if !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), "pgsql: ") {
			t.Errorf("%s: err = %v, want fence.ErrInvalid prefixed \"pgsql: \"", name, err)
		}
	}
	if n := cc.tries.Load(); n != 0 {
		t.Fatalf("bad input asked for a connection %d times, want 0", n)
	}
	// Guard on a live transaction: a bad fence leaves it untouched.
	e := setup(t, d)
	tx := e.begin(sql.LevelDefault)
	if err := pgsql.Guard(e.ctx, tx, fenceOf("r", 0, "h")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Guard token 0: %v", err)
	}
	if err := pgsql.Guard(e.ctx, tx, fenceOf("r", 1, "h")); err != nil {
		t.Fatalf("the transaction after a refused fence: %v (it must still be usable)", err)
	}
}

// testZeroFenceMessages: a zero fence names the package and the call, and
// says what to do.
func testZeroFenceMessages(t *testing.T, d Driver) {
	e := setup(t, d)
	tbl := pgsql.Table{Name: "counter", Key: "id"}
	tx := e.begin(sql.LevelDefault)
	noop := func(context.Context, *sql.Tx) error { return nil }
	for call, err := range map[string]error{
		"InTx":         pgsql.InTx(e.ctx, e.db, nil, fence.Fence{}, noop),
		"Guard":        pgsql.Guard(e.ctx, tx, fence.Fence{}),
		"GuardAll":     pgsql.GuardAll(e.ctx, tx, fence.Fence{}),
		"Table.Update": tbl.Update(e.ctx, e.db, fence.Fence{}, 1),
		"Table.Upsert": tbl.Upsert(e.ctx, e.db, fence.Fence{}, 1),
		"Once":         func() error { _, err := pgsql.Once(e.ctx, e.db, fence.Fence{}, "k", noop); return err }(),
	} {
		want := "pgsql: " + call + ": invalid fence: zero Fence: was an error from Acquire or FenceLock ignored?; check the error of the call that gave you the fence, and pass the fence of a lock you hold"
		if err == nil || err.Error() != want || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v\nwant %s", call, err, want)
		}
	}
}

// testSharedWithPostgres guards one resource through storage/postgres (pgx)
// and through this package on one database: one mark, whichever package
// raised it.
func testSharedWithPostgres(t *testing.T, d Driver) {
	e := setup(t, d)
	pool, err := pgxpool.New(e.ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	byPgx := fenceOf("r", 5, "pgx")
	bump := postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`}
	if _, err := postgres.Exec(e.ctx, pool, byPgx, bump); err != nil {
		t.Fatalf("postgres.Exec: %v", err)
	}
	if got := e.mark("r"); got.Token != 5 || got.Holder != "pgx" {
		t.Fatalf("pgsql.HighWater after postgres.Exec = %v", got)
	}
	err = pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 4, "sql"), increment)
	wantStale(t, err, byPgx)
	bySQL := fenceOf("r", 6, "sql")
	if err := pgsql.InTx(e.ctx, e.db, nil, bySQL, increment); err != nil {
		t.Fatal(err)
	}
	_, err = postgres.Exec(e.ctx, pool, byPgx, bump)
	var se *fence.StaleError
	if !errors.As(err, &se) || se.HighWater.Token != 6 || se.HighWater.Holder != "sql" {
		t.Fatalf("postgres.Exec after pgsql raised the mark = %v, want stale against token 6", err)
	}
	if m, err := postgres.HighWater(e.ctx, pool, "r"); err != nil || m.Token != 6 {
		t.Fatalf("postgres.HighWater = %v, %v", m, err)
	}
	if n := e.counter(); n != 2 {
		t.Fatalf("counter = %d, want 2", n)
	}
}

// testOnce: a key's work commits once; fn's error records nothing;
// LookupOnce reads the record; a stale fence is refused.
func testOnce(t *testing.T, d Driver) {
	e := setup(t, d)
	f := fenceOf("r", 3, "a")
	boom := errors.New("boom")
	ran, err := pgsql.Once(e.ctx, e.db, f, "job", func(ctx context.Context, tx *sql.Tx) error {
		if err := increment(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if ran || !errors.Is(err, boom) {
		t.Fatalf("Once with a failing fn = %v, %v", ran, err)
	}
	for i, want := range []bool{true, false, false} {
		ran, err := pgsql.Once(e.ctx, e.db, f, "job", increment)
		if err != nil || ran != want {
			t.Fatalf("call %d: ran %v, err %v; want ran %v", i, ran, err, want)
		}
	}
	if n := e.counter(); n != 1 {
		t.Fatalf("counter = %d, want 1", n)
	}
	rec, err := pgsql.LookupOnce(e.ctx, e.db, "job")
	if err != nil || rec.Resource != f.Resource || rec.Token != f.Token || rec.HolderMark != fence.HolderMark(f.Holder) || rec.Done.IsZero() {
		t.Fatalf("LookupOnce = %+v, %v; want the record of %v (holder mark %s)", rec, err, f, fence.HolderMark(f.Holder))
	}
	// The row keeps the holder's mark, never the holder id.
	var holder string
	if err := e.db.QueryRowContext(e.ctx, "SELECT holder FROM fencekit_once WHERE key = 'job'").Scan(&holder); err != nil || holder != fence.HolderMark(f.Holder) {
		t.Fatalf("fencekit_once.holder = %q, %v; want the mark %q", holder, err, fence.HolderMark(f.Holder))
	}
	_, err = pgsql.Once(e.ctx, e.db, fenceOf("r", 2, "old"), "job2", increment)
	wantStale(t, err, f)
	// Racing keys: ten calls, one runs.
	var runs atomic.Int32
	errs := make(chan error, 10)
	for i := range 10 {
		go func() {
			ran, err := pgsql.Once(e.ctx, e.db, fenceOf("k"+string(rune('a'+i)), 1, "h"), "race", increment)
			if ran {
				runs.Add(1)
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || e.counter() != 2 {
		t.Fatalf("%d of ten racing calls ran, counter %d; want 1 and 2", runs.Load(), e.counter())
	}
}
