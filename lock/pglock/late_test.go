package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestLateGrantNeverStands: a grant request held in the network past its
// caller's deadline (TryAcquire with 200ms, the request delivered after
// 1.5s), or past a retry that the caller then released (the first
// request's connection reset while the request was still in the network),
// is delivered and run by the server after the caller's cleanup; the lock
// must not stand granted to a holder nobody has: another Locker gets it
// within a few seconds of the late request's delivery, not after the
// late grant's 30s lease.
func TestLateGrantNeverStands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reset   bool // the first request's connection reset: a retry answers
		refused bool // the retry is refused (another holder has the lock)
	}{
		{"past the caller's deadline", false, false},
		{"past a retry the caller released", true, false},
		{"past a retry that was refused", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := migratedPool(t)
			proxy := testenv.StartProxy(t, hostPort(t, base))
			pool := poolAt(t, base, "postgres://postgres@"+proxy.Addr()+"/test?sslmode=disable", map[string]string{"pool_max_conns": "2"})
			late, err := New(pool, lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
			if err != nil {
				t.Fatal(err)
			}
			defer late.Close()
			other, err := New(base, lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			ctx := ctxFor(t, 60*time.Second)
			// Warm the one connection, so the held bytes are the grant's
			// own request (pgx prepares a statement in a round trip of its
			// own, the first time).
			for range 2 {
				ls, err := late.TryAcquire(ctx, "warm", time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			proxy.HoldNextRequest(1500*time.Millisecond, tc.reset)
			held := 1 // requests held so far
			if tc.refused {
				// Another holder has the lock for 300ms: the retry is
				// refused, and the held request lands on a free lock.
				if _, err := other.TryAcquire(ctx, "r", 300*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				var na *lock.NotAcquiredError
				if _, err := late.TryAcquire(ctx, "r", 30*time.Second); !errors.As(err, &na) {
					t.Fatalf("TryAcquire with its first request's connection reset and the lock held = %v, want NotAcquiredError", err)
				}
			} else if tc.reset {
				ls, err := late.TryAcquire(ctx, "r", 30*time.Second)
				if err != nil {
					t.Fatalf("TryAcquire with its first request's connection reset = %v, want a grant from the retry", err)
				}
				if err := ls.Release(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				for attempt := 1; ; attempt++ {
					short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					ls, err := late.TryAcquire(short, "r", 30*time.Second)
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						break
					}
					if err != nil || attempt == 3 {
						t.Fatalf("TryAcquire with its request held = %v (attempt %d), want context.DeadlineExceeded", err, attempt)
					}
					// Another request of the pool's (on its other
					// connection) took the held place, and the grant went
					// through: give it back, let that request land, and
					// hold the next one again.
					if err := ls.Release(ctx); err != nil {
						t.Fatal(err)
					}
					eventually(t, 10*time.Second, "the held request delivered", func() bool { return proxy.Faults().HeldRequests == attempt })
					proxy.HoldNextRequest(1500*time.Millisecond, tc.reset)
					held = attempt + 1
				}
			}
			eventually(t, 10*time.Second, "the held request delivered", func() bool { return proxy.Faults().HeldRequests == held })
			// The server has the late request now; give it the time to run.
			start := time.Now()
			var got *lock.Lease
			for time.Since(start) < 8*time.Second {
				try, cancel := context.WithTimeout(ctx, 2*time.Second)
				got, err = other.TryAcquire(try, "r", time.Second)
				cancel()
				if err == nil {
					break
				}
				var na *lock.NotAcquiredError
				if !errors.As(err, &na) {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if got == nil {
				var holder *string
				var rem float64
				_ = base.QueryRow(ctx, `SELECT holder, extract(epoch FROM expires_at - clock_timestamp()) FROM fencekit_lock WHERE resource = 'r'`).Scan(&holder, &rem)
				t.Fatalf("8s after the late request reached the server the lock still stands granted to a holder nobody has (%v, %.1fs left): %v", holder != nil, rem, err)
			}
			t.Logf("another Locker got the lock %v after the late request's delivery", time.Since(start).Round(time.Millisecond))
		})
	}
}
