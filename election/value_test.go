package election_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

// TestValueWithNULRefused: a value holding a NUL byte (which PostgreSQL's
// text cannot keep) is refused by Campaign, Run and Proclaim before
// anything is sent, with an error matching fence.ErrInvalid that does not
// say a reply was lost, on Redis and on PostgreSQL alike: no lock is taken
// (another candidate wins at once), no leader is recorded.
func TestValueWithNULRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		locker func(t *testing.T) *lock.Locker
	}{
		{"redis", func(t *testing.T) *lock.Locker {
			return newLocker(t, testenv.Redis(t), "elnul:"+fence.NewHolder()[:8]+":")
		}},
		{"postgres", func(t *testing.T) *lock.Locker {
			pool := testenv.Postgres(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := migrations.UpPool(ctx, pool); err != nil {
				t.Fatal(err)
			}
			l, err := pglock.New(pool)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			return l
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.locker(t)
			e := newElection(t, l, "nul")
			other := newElection(t, l, "nul")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, fence.ErrInvalid) {
					t.Fatalf("%s with a NUL byte = %v, want an error matching fence.ErrInvalid", op, err)
				}
				if strings.Contains(err.Error(), "lost") {
					t.Fatalf("%s with a NUL byte says a reply was lost: %v", op, err)
				}
			}
			short, stop := context.WithTimeout(ctx, 5*time.Second)
			term, err := e.Campaign(short, "host-a\x00b")
			stop()
			if term != nil {
				_ = term.Resign(ctx)
			}
			check("Campaign", err)
			runCtx, stopRun := context.WithTimeout(ctx, 5*time.Second)
			check("Run", election.Run(runCtx, e, "host-a\x00b", func(context.Context, fence.Fence) error { return nil }))
			stopRun()
			if _, err := e.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
				t.Fatalf("Leader after the refused Campaign = %v, want ErrNoLeader", err)
			}
			quick, stopQuick := context.WithTimeout(ctx, 3*time.Second)
			good, err := other.Campaign(quick, "host-b")
			stopQuick()
			if err != nil {
				t.Fatalf("another candidate after the refused Campaign: %v (was a lock taken?)", err)
			}
			defer func() { _ = good.Resign(ctx) }()
			check("Proclaim", good.Proclaim(ctx, "host-b\x00c"))
			if l, err := e.Leader(ctx); err != nil || l.Value != "host-b" {
				t.Fatalf("Leader after the refused Proclaim = %+v, %v; want host-b", l, err)
			}
		})
	}
}
