package pglock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

func TestGrantExtendRelease(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 30*time.Second)

	before := time.Now().UnixMicro()
	g, err := b.tryAcquire(ctx, "r", "h1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Clock-anchored: the token is the server's clock in µs, as the Redis
	// lock's is, so marks left by a Redis lock (about 1.8e15) admit it.
	if int64(g.token) < before-5_000_000 || g.token > fence.MaxToken || !g.fromClock {
		t.Fatalf("first grant = %+v, want a token from the clock near %d", g, before)
	}
	if g.remaining != 5*time.Second {
		t.Fatalf("remaining = %v, want 5s", g.remaining)
	}
	// Another holder is refused, with what is left of the lease.
	_, err = b.tryAcquire(ctx, "r", "h2", time.Second)
	var na *lock.NotAcquiredError
	if !errors.As(err, &na) || !errors.Is(err, lock.ErrNotAcquired) || na.Remaining <= 0 || na.Remaining > 5*time.Second {
		t.Fatalf("second holder: %v, want NotAcquiredError with the lease left", err)
	}
	// A retry of the grant (its reply lost) returns the same grant.
	again, err := b.tryAcquire(ctx, "r", "h1", 5*time.Second)
	if err != nil || again.token != g.token || !again.retried {
		t.Fatalf("retried grant = %+v, %v; want token %d again", again, err, g.token)
	}
	// Extend never shortens.
	rem, err := b.extend(ctx, "r", "h1", time.Second)
	if err != nil || rem < 4*time.Second {
		t.Fatalf("extend to 1s = %v, %v; want the longer lease kept", rem, err)
	}
	rem, err = b.extend(ctx, "r", "h1", 20*time.Second)
	if err != nil || rem != 20*time.Second {
		t.Fatalf("extend to 20s = %v, %v", rem, err)
	}
	if _, err := b.extend(ctx, "r", "h2", time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("extend by another holder = %v, want ErrNotHeld", err)
	}
	// Release only by the holder; a retried release finds it gone.
	if held, err := b.release(ctx, "r", "h2"); err != nil || held {
		t.Fatalf("release by another holder = %v, %v", held, err)
	}
	if held, err := b.release(ctx, "r", "h1"); err != nil || !held {
		t.Fatalf("release = %v, %v", held, err)
	}
	if held, err := b.release(ctx, "r", "h1"); err != nil || held {
		t.Fatalf("second release = %v, %v; want not held", held, err)
	}
	g2, err := b.tryAcquire(ctx, "r", "h2", time.Second)
	if err != nil || g2.token <= g.token || g2.fromClock {
		t.Fatalf("next grant = %+v, %v; want a token above %d from the kept row", g2, err, g.token)
	}
}

// TestLeaseEndsOnServerClock: a lease ends when the server's clock says
// so; the next holder is refused before and granted after.
func TestLeaseEndsOnServerClock(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 30*time.Second)
	g, err := b.tryAcquire(ctx, "r", "h1", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.tryAcquire(ctx, "r", "h2", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("before the lease's end: %v, want ErrNotAcquired", err)
	}
	var expiresIn time.Duration
	var us int64
	if err := pool.QueryRow(ctx, `SELECT floor(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint FROM fencekit_lock WHERE resource = 'r'`).Scan(&us); err != nil {
		t.Fatal(err)
	}
	expiresIn = time.Duration(us) * time.Microsecond
	time.Sleep(expiresIn + 20*time.Millisecond)
	g2, err := b.tryAcquire(ctx, "r", "h2", time.Second)
	if err != nil || g2.token <= g.token {
		t.Fatalf("after the lease's end: %+v, %v", g2, err)
	}
	if _, err := b.extend(ctx, "r", "h1", time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("extend of the lapsed lease = %v, want ErrNotHeld", err)
	}
	if held, _ := b.release(ctx, "r", "h1"); held {
		t.Fatal("the lapsed holder released the new holder's lock")
	}
}

// TestTokensAcrossRowRemoval: idle rows are reclaimed, and tokens keep
// increasing once a row is gone (the clock carries order), also when the
// counter ran ahead of the clock (the row is kept until the clock passed it).
func TestTokensAcrossRowRemoval(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{retention: time.Millisecond})
	ctx := ctxFor(t, 30*time.Second)
	var last fence.Token
	for i := range 5 {
		g, err := b.tryAcquire(ctx, "r", fence.NewHolder(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if g.token <= last {
			t.Fatalf("grant %d: token %d not above %d", i, g.token, last)
		}
		if i > 0 && !g.fromClock {
			t.Fatalf("grant %d: the row was not reclaimed", i)
		}
		last = g.token
		rows, err := b.holderRelease(ctx, "r", g)
		if err != nil {
			t.Fatal(err)
		}
		_ = rows
		time.Sleep(5 * time.Millisecond)
		n, err := b.reclaim(ctx, 100)
		if err != nil || n != 1 {
			t.Fatalf("reclaim = %d, %v; want the idle row gone", n, err)
		}
		if _, ok := rowOf(t, pool, "r"); ok {
			t.Fatal("the row outlived its reclaim")
		}
	}
	// A counter ahead of the clock (the clock went back, or Advance-like
	// state): the row stays until the clock has passed it.
	ahead := time.Now().Add(3 * time.Second).UnixMicro()
	g, err := b.tryAcquire(ctx, "r", "hx", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE fencekit_lock SET token = $2, retain_until = fencekit_lock_keep($2, expires_at, 1) WHERE resource = $1`, "r", ahead); err != nil {
		t.Fatal(err)
	}
	if _, err := b.release(ctx, "r", "hx"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if n, err := b.reclaim(ctx, 100); err != nil || n != 0 {
		t.Fatalf("reclaim of a row whose counter is ahead of the clock = %d, %v; want it kept", n, err)
	}
	g2, err := b.tryAcquire(ctx, "r", "hy", time.Second)
	if err != nil || int64(g2.token) != ahead+1 || g2.token <= g.token {
		t.Fatalf("grant after a counter ahead of the clock = %+v, %v; want %d", g2, err, ahead+1)
	}
}

// holderRelease releases g's grant of resource; the holder is found by
// token, for tests that drew a holder id inline.
func (b *backend) holderRelease(ctx context.Context, resource string, g *grant) (bool, error) {
	var holder string
	if err := b.pool.QueryRow(ctx, `SELECT holder FROM fencekit_lock WHERE resource = $1 AND token = $2`, resource, int64(g.token)).Scan(&holder); err != nil {
		return false, err
	}
	return b.release(ctx, resource, holder)
}

func TestTokensExhausted(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 30*time.Second)
	if _, err := b.tryAcquire(ctx, "r", "h1", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.release(ctx, "r", "h1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE fencekit_lock SET token = $1 WHERE resource = 'r'`, int64(fence.MaxToken)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.tryAcquire(ctx, "r", "h2", time.Second); !errors.Is(err, lock.ErrTokensExhausted) {
		t.Fatalf("grant past 2^53-1 = %v, want ErrTokensExhausted", err)
	}
	var holder *string
	if err := pool.QueryRow(ctx, `SELECT holder FROM fencekit_lock WHERE resource = 'r'`).Scan(&holder); err != nil || holder != nil {
		t.Fatalf("after the refusal the lock is held by %v (%v), want free", holder, err)
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	// An unmigrated schema: anything sent would fail with ErrNotMigrated.
	pool := testenv.Postgres(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 10*time.Second)
	long := strings.Repeat("x", fence.MaxResourceLen+1)
	cases := []struct {
		name string
		call func() error
	}{
		{"empty resource", func() error { _, err := b.tryAcquire(ctx, "", "h", time.Second); return err }},
		{"long resource", func() error { _, err := b.tryAcquire(ctx, long, "h", time.Second); return err }},
		{"NUL resource", func() error { _, err := b.tryAcquire(ctx, "a\x00b", "h", time.Second); return err }},
		{"bad UTF-8", func() error { _, err := b.tryAcquire(ctx, "\xff", "h", time.Second); return err }},
		{"zero lease", func() error { _, err := b.tryAcquire(ctx, "r", "h", 0); return err }},
		{"sub-ms lease", func() error { _, _, err := b.try(ctx, "Acquire", "r", "h", time.Microsecond, 0, true); return err }},
		{"long lease", func() error { _, err := b.extend(ctx, "r", "h", lock.MaxTTL+time.Millisecond); return err }},
		{"empty holder", func() error { _, err := b.release(ctx, "r", ""); return err }},
		{"nil context", func() error { var none context.Context; _, err := b.release(none, "r", "h"); return err }},
		{"record token", func() error { return b.setRecord(ctx, "r", "h", 0, "v", 0) }},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v, want fence.ErrInvalid", c.name, err)
		}
	}
}

func TestNotMigratedNamesCallAndMigration(t *testing.T) {
	pool := testenv.Postgres(t)
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 10*time.Second)
	_, err := b.tryAcquire(ctx, "r", "h", time.Second)
	if !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("TryAcquire on an unmigrated database = %v, want ErrNotMigrated", err)
	}
	for _, want := range []string{"TryAcquire", `"r"`, "00006_fencekit_lock", "migrations.UpPool"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not name %s", err, want)
		}
	}
	if _, err := b.extend(ctx, "r", "h", time.Second); !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "Extend") {
		t.Errorf("Extend = %v", err)
	}
}
