package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestElectionOnPostgres: the election runs unchanged on a Locker of
// pglock.New: Campaign, Leader, Observe (woken by the record's NOTIFY),
// Resign handing over to the next candidate, and a deposed leader's write
// refused by the PostgreSQL guard. No Redis anywhere.
func TestElectionOnPostgres(t *testing.T) {
	pool := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ea, err := election.New(newLocker(t, pool), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := election.New(newLocker(t, pool), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ea.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader before any term = %v, want ErrNoLeader", err)
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	seen := eb.Observe(obsCtx)

	a, err := ea.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := eb.Leader(ctx); err != nil || l.Value != "node-a" || l.Token != a.Fence().Token {
		t.Fatalf("Leader = %+v, %v; want node-a with token %d", l, err, a.Fence().Token)
	}
	next := func(want string) election.Leader {
		t.Helper()
		for {
			select {
			case l := <-seen:
				if l.Value == want {
					return l
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the observer never saw %s", want)
			}
		}
	}
	la := next("node-a")

	// b waits in the queue; a's Resign hands the lock over at once.
	bTerm := make(chan *election.Term, 1)
	go func() {
		b, err := eb.Campaign(ctx, "node-b")
		if err != nil {
			t.Error(err)
			bTerm <- nil
			return
		}
		bTerm <- b
	}()
	time.Sleep(200 * time.Millisecond)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-bTerm
	if b == nil {
		return
	}
	lb := next("node-b")
	if lb.Token <= la.Token || b.Fence().Token != lb.Token {
		t.Fatalf("terms seen %+v then %+v; want increasing tokens, the second b's (%d)", la, lb, b.Fence().Token)
	}
	// a's fence, from a term that ended, is refused once b has written.
	write := func(f fence.Fence) error {
		return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error { return nil })
	}
	if err := write(b.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := write(a.Fence()); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the deposed leader's write = %v, want fence.ErrStale", err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestObserveTrustsOnlyItsOwnRecord: two schemas of one database each run
// an election named "scheduler" (NOTIFY channels are per database, and a
// record is named by the md5 of its name alone), and a role with no
// privilege on the lock's tables sends a forged NOTIFY with a token near
// 2^53. A's observer reports only A's terms, as A's record holds them:
// never B's leader, never the forged one, and A's next real leader still.
func TestObserveTrustsOnlyItsOwnRecord(t *testing.T) {
	poolA, poolB := migrated(t), migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ea, err := election.New(newLocker(t, poolA), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := election.New(newLocker(t, poolB), "scheduler", election.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a, err := ea.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	seen := ea.Observe(obsCtx)
	select {
	case l := <-seen:
		if l.Value != "node-a" {
			t.Fatalf("A's observer first saw %+v, want node-a", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("A's observer saw nothing")
	}
	b, err := eb.Campaign(ctx, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Resign(ctx) }()
	if _, err := poolA.Exec(ctx, `SELECT pg_notify('fencekit_lock_record', substr(md5('scheduler'), 1, 16) || ' 9000000000000000 forged')`); err != nil {
		t.Fatal(err)
	}
	quiet := time.After(2 * time.Second)
	for done := false; !done; {
		select {
		case l := <-seen:
			t.Fatalf("A's observer reported %+v while A's leader is node-a (token %d)", l, a.Fence().Token)
		case <-quiet:
			done = true
		}
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	a2, err := ea.Campaign(ctx, "node-a2")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a2.Resign(ctx) }()
	for {
		select {
		case l := <-seen:
			if l.Value == "node-a2" && l.Token == a2.Fence().Token {
				return
			}
			if l.Value != "node-a" {
				t.Fatalf("A's observer reported %+v, want node-a2 (token %d)", l, a2.Fence().Token)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("A's observer never saw A's next leader")
		}
	}
}
