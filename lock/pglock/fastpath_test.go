package pglock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

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
