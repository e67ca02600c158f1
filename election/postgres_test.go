package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

// TestElectionOnPostgreSQL runs an election on PostgreSQL alone: the
// election uses only the lock backend's record and its watch, so a
// PostgreSQL Locker campaigns, reads and observes leaders as a Redis one
// does, and a resignation hands the election to the queued candidate with
// a higher token.
func TestElectionOnPostgreSQL(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	locker := func() *lock.Locker {
		l, err := pglock.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	ea := newElection(t, locker(), "pg-election")
	eb := newElection(t, locker(), "pg-election")
	watch := newElection(t, locker(), "pg-election")
	var names election.RedisNames
	if ea.As(&names) {
		t.Errorf("As(*RedisNames) = %+v on PostgreSQL, want false", names)
	}
	if _, err := watch.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader before any term = %v, want ErrNoLeader", err)
	}
	obs, stop := context.WithCancel(ctx)
	defer stop()
	ch := watch.Observe(obs)

	a := mustCampaign(t, ea, "a")
	if l, err := watch.Leader(ctx); err != nil || l.Value != "a" || l.Token != a.Fence().Token {
		t.Fatalf("Leader = %+v, %v; want a with token %d", l, err, a.Fence().Token)
	}
	if l := <-ch; l.Value != "a" || l.Token != a.Fence().Token {
		t.Fatalf("observed %+v, want a", l)
	}
	bc := campaignAsync(ctx, eb, "b")
	time.Sleep(100 * time.Millisecond)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ob := <-bc
	if ob.err != nil {
		t.Fatal(ob.err)
	}
	if ob.term.Fence().Token <= a.Fence().Token {
		t.Fatalf("b's token %d is not above a's %d", ob.term.Fence().Token, a.Fence().Token)
	}
	if l := <-ch; l.Value != "b" || l.Token != ob.term.Fence().Token {
		t.Fatalf("observed %+v, want b", l)
	}
	if l, err := watch.Leader(ctx); err != nil || l.Value != "b" {
		t.Fatalf("Leader = %+v, %v; want b", l, err)
	}
	if err := ob.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after the last resignation = %v, want ErrNoLeader", err)
	}
}
