package pglock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

func TestNewRefusesBadInput(t *testing.T) {
	if _, err := pglock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(nil) = %v, want fence.ErrInvalid", err)
	}
	if lockbackend.Open == nil {
		t.Skip("package lock opens no backends in this build")
	}
	pool := testenv.Postgres(t)
	if _, err := pglock.New(pool, lock.WithPrefix("x:")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New with a Redis key prefix = %v, want fence.ErrInvalid", err)
	}
}

// newLocker is a Locker of pglock.New on a migrated schema of t's own.
func newLocker(t *testing.T, pool *pgxpool.Pool, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := pglock.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestLockerOnPostgres: the Locker of pglock.New is the lock package's
// Locker: TryAcquire, Extend, Release, Acquire waiting in the queue
// (woken by the release), Do, and Advance.
func TestLockerOnPostgres(t *testing.T) {
	pool := migrated(t)
	l := newLocker(t, pool)
	other := newLocker(t, pool) // another process
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	lease, err := l.TryAcquire(ctx, "acct", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := lease.Fence()
	if f.Token < 1_000_000_000_000_000 || f.Token > fence.MaxToken {
		t.Fatalf("token %d: want a clock-anchored token (about 1.8e15)", f.Token)
	}
	if _, err := other.TryAcquire(ctx, "acct", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := lease.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got := make(chan fence.Fence, 1)
	go func() {
		w, err := other.Acquire(ctx, "acct", 5*time.Second)
		if err != nil {
			t.Error(err)
			got <- fence.Fence{}
			return
		}
		got <- w.Fence()
		_ = w.Release(ctx)
	}()
	time.Sleep(200 * time.Millisecond) // let the waiter queue
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case wf := <-got:
		if wf.Token <= f.Token {
			t.Fatalf("waiter's token %d not above %d", wf.Token, f.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter never had the lock")
	}
	ran := false
	if err := l.Do(ctx, "acct", time.Second, func(ctx context.Context, f fence.Fence) error {
		ran = f.Token > 0
		return nil
	}); err != nil || !ran {
		t.Fatalf("Do = %v (ran %v)", err, ran)
	}
	if err := l.Advance(ctx, "acct", fence.MaxToken-10); err != nil {
		t.Fatal(err)
	}
	last, err := l.TryAcquire(ctx, "acct", time.Second)
	if err != nil || last.Fence().Token <= fence.MaxToken-10 {
		t.Fatalf("TryAcquire after Advance = %v, %v", last, err)
	}
	_ = last.Release(ctx)
}

// TestRedisOnlyCallsRefused: what the PostgreSQL lock does not offer is
// refused with fence.ErrInvalid and nothing is taken.
func TestRedisOnlyCallsRefused(t *testing.T) {
	pool := migrated(t)
	l := newLocker(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.TryAcquire(ctx, "r", time.Second, lock.Owner("worker-1")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("TryAcquire with an Owner = %v, want fence.ErrInvalid", err)
	}
	if _, err := l.FenceLock(ctx, "some:lock", "value"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("FenceLock = %v, want fence.ErrInvalid", err)
	}
	if l.As(new(lock.RedisNames)) {
		t.Fatal("As(*lock.RedisNames) = true on PostgreSQL, want false")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencekit_lock WHERE holder IS NOT NULL`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d locks held after the refusals (%v)", n, err)
	}
}

// TestIdleRowsReclaimed: a Locker deletes the rows of resources idle past
// their retention by itself, and tokens keep increasing after.
func TestIdleRowsReclaimed(t *testing.T) {
	pool := migrated(t)
	l := newLocker(t, pool, lock.WithTokenRetention(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last fence.Token
	for i := range 2 {
		ls, err := l.TryAcquire(ctx, "idle", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ls.Fence().Token <= last {
			t.Fatalf("grant %d: token %d not above %d", i, ls.Fence().Token, last)
		}
		last = ls.Fence().Token
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		within(t, 10*time.Second, "idle row reclaimed", func() bool {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencekit_lock`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
	}
}

// TestNotMigratedErrorNamesTheCall: on a database without the lock's
// migrations, New succeeds (it waits on nothing) and each call's error
// matches ErrNotMigrated and names that call: TryAcquire as TryAcquire,
// Acquire as Acquire.
func TestNotMigratedErrorNamesTheCall(t *testing.T) {
	pool := testenv.Postgres(t) // a schema of its own, never migrated
	l := newLocker(t, pool, lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := l.TryAcquire(ctx, "r", time.Second)
	if !errors.Is(err, pglock.ErrNotMigrated) || !strings.Contains(err.Error(), `TryAcquire "r"`) {
		t.Errorf("TryAcquire on an unmigrated database = %v, want ErrNotMigrated naming TryAcquire", err)
	}
	_, err = l.Acquire(ctx, "r", time.Second)
	if !errors.Is(err, pglock.ErrNotMigrated) || !strings.Contains(err.Error(), `Acquire "r"`) || strings.Contains(err.Error(), "TryAcquire") {
		t.Errorf("Acquire on an unmigrated database = %v, want ErrNotMigrated naming Acquire", err)
	}
}
