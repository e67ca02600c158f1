package pglock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// Migration 00007 lets a grant of a free lock and a release with nobody
// queued skip the queue, trusting fencekit_lock.waiting: these tests check
// that the flag is set whenever an entry exists, so that the queue keeps
// its order and its hand-overs.

// holderOf reads resource's holder ("" when free or missing).
func holderOf(t testing.TB, pool *pgxpool.Pool, resource string) string {
	t.Helper()
	var h *string
	err := pool.QueryRow(context.Background(), `SELECT holder FROM fencekit_lock WHERE resource = $1`, resource).Scan(&h)
	if err != nil || h == nil {
		return ""
	}
	return *h
}

// checkFlag fails when resource has queue entries while its row says
// none.
func checkFlag(t testing.TB, pool *pgxpool.Pool, resource, when string) {
	t.Helper()
	var entries, flag bool
	err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM fencekit_lock_waiter WHERE resource = $1),
		coalesce((SELECT waiting FROM fencekit_lock WHERE resource = $1), false)`, resource).Scan(&entries, &flag)
	if err != nil {
		t.Fatal(err)
	}
	if entries && !flag {
		t.Fatalf("%s: %q has queue entries but its row's waiting flag is false", when, resource)
	}
}

// endLease ends resource's current lease on the server's clock, as its
// running out would.
func endLease(t testing.TB, pool *pgxpool.Pool, resource string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`UPDATE fencekit_lock SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE resource = $1`, resource); err != nil {
		t.Fatal(err)
	}
}

// queue makes holder a queued waiter of resource, held by another.
func queue(t testing.TB, b *backend, resource, holder string) {
	t.Helper()
	g, r, err := b.try(ctxFor(t, 10*time.Second), "Acquire", resource, holder, 10*time.Second, 3*time.Second, true)
	if err != nil || g != nil || r == nil || r.place < 0 {
		t.Fatalf("%s queueing: %+v %+v %v; want a refusal with a place", holder, g, r, err)
	}
}

// A lock whose lease ran out while a waiter was queued goes to that
// waiter, not to a newcomer's TryAcquire: the grant's fast path must not
// take a free lock with a live queue.
func TestFastGrantRespectsQueue(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 30*time.Second)
	const r = "pgperf-order"
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	queue(t, b, r, "w")
	checkFlag(t, pool, r, "after queueing")
	endLease(t, pool, r)
	_, err := b.tryAcquire(ctx, r, "newcomer", 10*time.Second)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("newcomer on a free lock with a live waiter: %v, want refused", err)
	}
	if h := holderOf(t, pool, r); h != "w" {
		t.Fatalf("holder after the newcomer's try = %q, want the queued waiter", h)
	}
}

// A waiter that gives up while another is queued leaves the flag set: the
// holder's release still hands the lock to the one left.
func TestFastReleaseHandsOverAfterAWaiterLeft(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 30*time.Second)
	const r = "pgperf-leave"
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	queue(t, b, r, "w1")
	queue(t, b, r, "w2")
	if held, err := b.releaseAs(ctx, "Acquire", r, "w1", true); err != nil || held {
		t.Fatalf("w1 giving up: %v %v", held, err)
	}
	checkFlag(t, pool, r, "after w1 left")
	if held, err := b.release(ctx, r, "a"); err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	if h := holderOf(t, pool, r); h != "w2" {
		t.Fatalf("holder after the release = %q, want w2, the waiter left in the queue", h)
	}
	// w2 takes its grant, its entry goes; with nobody queued its release
	// frees the lock, and the flag is down again.
	if g, err := b.tryAcquire(ctx, r, "w2", 10*time.Second); err != nil || !g.retried {
		t.Fatalf("w2 taking its grant: %+v %v", g, err)
	}
	if held, err := b.release(ctx, r, "w2"); err != nil || !held {
		t.Fatalf("w2's release: %v %v", held, err)
	}
	var flag bool
	if err := pool.QueryRow(ctx, `SELECT waiting FROM fencekit_lock WHERE resource = $1`, r).Scan(&flag); err != nil || flag {
		t.Fatalf("waiting after the queue emptied = %v, %v; want false", flag, err)
	}
	if h := holderOf(t, pool, r); h != "" {
		t.Fatalf("holder after the last release = %q, want none", h)
	}
}

// A database that had waiters queued when migration 00007 was applied
// hands the lock to them: the migration sets the flag of every row with
// entries.
func TestFastPathMigrationFlagsQueuedRows(t *testing.T) {
	pool := testenv.Postgres(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	ctx := ctxFor(t, 60*time.Second)
	p := provider(t, db)
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	b := testBackend(t, pool, config{poll: true})
	const r = "pgperf-upgrade"
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	queue(t, b, r, "w")
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	checkFlag(t, pool, r, "after the migration")
	if held, err := b.release(ctx, r, "a"); err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	if h := holderOf(t, pool, r); h != "w" {
		t.Fatalf("holder after the release = %q, want the waiter queued before the migration", h)
	}
}

func provider(t testing.TB, db *sql.DB) *goose.Provider {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The uncontended grant and release are plain SQL (grantSQL, releaseSQL)
// that calls a function only when its UPDATE matched no row: these tests
// check that the fast path calls no function at all, and that a database
// without migration 00008 gets the same answers from the older statements.

// functionCalls is how many times the current transaction of conn called
// the function named (track_functions must be on).
func functionCalls(t testing.TB, ctx context.Context, tx pgx.Tx, function string) int64 {
	t.Helper()
	var n *int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_function_calls($1::regproc)`, function).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == nil {
		return 0
	}
	return *n
}

func TestFastPathCallsNoFunction(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 30*time.Second)
	const r = "pgperf-nofunc"
	// The row exists and the lock is free: the uncontended case.
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if held, err := b.release(ctx, r, "a"); err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET track_functions = 'pl'`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var reply []int64
	if err := tx.QueryRow(ctx, grantSQL, r, "b", int64(10000), int64(60000), nil, true, "infinity").Scan(&reply); err != nil || len(reply) != 3 || reply[0] != replyGranted {
		t.Fatalf("uncontended grant: %v %v, want the fast path's {1, token, lease}", reply, err)
	}
	var held bool
	if err := tx.QueryRow(ctx, releaseSQL, r, "b", int64(60000)).Scan(&held); err != nil || !held {
		t.Fatalf("uncontended release: %v %v", held, err)
	}
	for _, f := range []string{"fencekit_lock_grant", "fencekit_lock_acquire_full", "fencekit_lock_release_full"} {
		if n := functionCalls(t, ctx, tx, f); n != 0 {
			t.Errorf("the uncontended grant and release called %s %d times, want none", f, n)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A held lock: the grant's UPDATE matches no row, the function
	// decides (and refuses); so does a release by one who does not hold it.
	if _, err := b.tryAcquire(ctx, r, "c", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if tx, err = conn.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, grantSQL, r, "d", int64(10000), int64(60000), nil, true, "infinity").Scan(&reply); err != nil || len(reply) != 5 || reply[0] != replyRefused {
		t.Fatalf("grant to d of c's lock: %v %v, want the full path's refusal", reply, err)
	}
	if err := tx.QueryRow(ctx, releaseSQL, r, "d", int64(60000)).Scan(&held); err != nil || held {
		t.Fatalf("release by d: %v %v, want not held", held, err)
	}
	if n := functionCalls(t, ctx, tx, "fencekit_lock_grant"); n != 1 {
		t.Errorf("a refused grant called fencekit_lock_grant %d times, want 1", n)
	}
	if n := functionCalls(t, ctx, tx, "fencekit_lock_release_full"); n != 1 {
		t.Errorf("a release that found another holder called fencekit_lock_release_full %d times, want 1", n)
	}
}

// sqlRecorder records the statements a pool sends.
type sqlRecorder struct {
	mu   sync.Mutex
	sent []string
}

func (s *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.sent = append(s.sent, d.SQL)
	s.mu.Unlock()
	return ctx
}

func (*sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// count is how many of the statements sent since the last count were q.
func (s *sqlRecorder) count(q string) (n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sent := range s.sent {
		if sent == q {
			n++
		}
	}
	return n
}

func (s *sqlRecorder) reset() {
	s.mu.Lock()
	s.sent = nil
	s.mu.Unlock()
}

// A database migrated to 00006 or 00007 only gets every answer from the
// older statements: the newer grant is tried once, found missing, and not
// tried again until the probe's time has passed; once the database is
// migrated, the newer statements are taken.
func TestOlderSchemaTakesOlderStatements(t *testing.T) {
	for _, version := range []int64{lockBeforeFastPath, lockBeforeGrant} {
		t.Run(fmt.Sprintf("at %05d", version), func(t *testing.T) {
			base := testenv.Postgres(t)
			db := stdlib.OpenDBFromPool(base)
			t.Cleanup(func() { _ = db.Close() })
			ctx := ctxFor(t, 60*time.Second)
			p := provider(t, db)
			if _, err := p.UpTo(ctx, version); err != nil {
				t.Fatal(err)
			}
			cfg := base.Config()
			rec := &sqlRecorder{}
			cfg.ConnConfig.Tracer = rec
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			b := testBackend(t, pool, config{poll: true})
			const r = "pgperf-older"
			if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
				t.Fatalf("grant on %05d: %v", version, err)
			}
			if _, err := b.tryAcquire(ctx, r, "b", 10*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("grant of a held lock on %05d: %v, want refused", version, err)
			}
			queue(t, b, r, "w")
			if held, err := b.releaseAs(ctx, "Acquire", r, "w", true); err != nil || held {
				t.Fatalf("a waiter leaving on %05d: %v %v", version, held, err)
			}
			if n := waiters(t, pool, r); n != 0 {
				t.Fatalf("%d queue entries after the waiter left, want none", n)
			}
			if held, err := b.release(ctx, r, "a"); err != nil || !held {
				t.Fatalf("release on %05d: %v %v", version, held, err)
			}
			if held, err := b.release(ctx, r, "a"); err != nil || held {
				t.Fatalf("release repeated on %05d: %v %v, want not held", version, held, err)
			}
			if n := rec.count(grantSQL); n != 1 {
				t.Errorf("on %05d the newer grant was sent %d times, want once (then the older statements)", version, n)
			}
			if n := rec.count(releaseSQL) + rec.count(leaveSQL); n != 0 {
				t.Errorf("on %05d the newer release was sent %d times after the grant found the schema older", version, n)
			}
			if n := rec.count(acquireSQL); n != 3 {
				t.Errorf("on %05d the older grant was sent %d times, want 3", version, n)
			}
			if n := rec.count(oldReleaseSQL); n != 3 {
				t.Errorf("on %05d the older release was sent %d times, want 3", version, n)
			}

			if _, err := p.Up(ctx); err != nil {
				t.Fatal(err)
			}
			b.olderUntil.Store(1) // the probe's time has passed
			rec.reset()
			if _, err := b.tryAcquire(ctx, r, "c", 10*time.Second); err != nil {
				t.Fatalf("grant after the migration: %v", err)
			}
			if held, err := b.release(ctx, r, "c"); err != nil || !held {
				t.Fatalf("release after the migration: %v %v", held, err)
			}
			if rec.count(grantSQL) != 1 || rec.count(releaseSQL) != 1 || rec.count(acquireSQL)+rec.count(oldReleaseSQL) != 0 {
				t.Errorf("after the migration: grant %d, release %d, older %d; want the newer statements only",
					rec.count(grantSQL), rec.count(releaseSQL), rec.count(acquireSQL)+rec.count(oldReleaseSQL))
			}
		})
	}
}

// A pool that keeps no statements prepared (here the simple protocol)
// plans every statement on every call: there the lock calls the functions
// instead of sending the plain SQL, and answers the same.
func TestUnpreparedPoolCallsFunctions(t *testing.T) {
	base := migratedPool(t)
	ctx := ctxFor(t, 30*time.Second)
	cfg := base.Config()
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	rec := &sqlRecorder{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := testBackend(t, pool, config{poll: true})
	const r = "pgperf-simple"
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.tryAcquire(ctx, r, "b", 10*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("grant of a held lock: %v, want refused", err)
	}
	queue(t, b, r, "w")
	if held, err := b.releaseAs(ctx, "Acquire", r, "w", true); err != nil || held {
		t.Fatalf("a waiter leaving: %v %v", held, err)
	}
	if held, err := b.release(ctx, r, "a"); err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	if _, err := b.tryAcquire(ctx, r, "c", 10*time.Second); err != nil {
		t.Fatalf("uncontended grant: %v", err)
	}
	if held, err := b.release(ctx, r, "c"); err != nil || !held {
		t.Fatalf("uncontended release: %v %v", held, err)
	}
	if rec.count(grantCallSQL) != 4 || rec.count(releaseCallSQL) != 2 || rec.count(leaveCallSQL) != 1 {
		t.Errorf("function calls sent: grant %d, release %d, leave %d; want 4, 2, 1",
			rec.count(grantCallSQL), rec.count(releaseCallSQL), rec.count(leaveCallSQL))
	}
	if n := rec.count(grantSQL) + rec.count(releaseSQL) + rec.count(leaveSQL); n != 0 {
		t.Errorf("the plain SQL was sent %d times on a pool that prepares nothing", n)
	}
}

// A grant whose UPDATE waits for the row (another transaction holds it
// locked) evaluates its WHERE clause again on the row as that transaction
// left it: when that was a grant to another holder, the UPDATE matches
// nothing, the full path decides in the same statement, and refuses.
func TestFastGrantAfterWaitingForTheRow(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 30*time.Second)
	const r = "pgperf-epq"
	if _, err := b.tryAcquire(ctx, r, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if held, err := b.release(ctx, r, "a"); err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Another grant, as the full path makes it, not yet committed.
	if _, err := tx.Exec(ctx, `UPDATE fencekit_lock SET holder = 'x', token = token + 1,
		expires_at = clock_timestamp() + interval '10 seconds' WHERE resource = $1`, r); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.tryAcquire(ctx, r, "b", 10*time.Second)
		got <- err
	}()
	eventually(t, 10*time.Second, "the grant waits for the row", func() bool {
		var n int
		// Only a backend blocked by this test's own transaction counts:
		// other tests' waiters on the same database must not satisfy it.
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY(pg_blocking_pids(pid)) AND query LIKE '%fencekit_lock_grant%'`, int(tx.Conn().PgConn().PID())).Scan(&n)
		return err == nil && n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("grant after the row was granted to another while it waited: %v, want refused", err)
	}
	if h := holderOf(t, pool, r); h != "x" {
		t.Fatalf("holder = %q, want x, whose grant committed while the other waited", h)
	}
}
