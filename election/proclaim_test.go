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
)

// A second Campaign through the Locker that leads returns at once with an
// error saying so, instead of queueing behind its own term until its ctx
// ends; once the term has ended, Campaign works again.
func TestSecondCampaignFromTheLeader(t *testing.T) {
	l := newLocker(t, testenv.Redis(t), "")
	e := newElection(t, l, "twice")
	term := mustCampaign(t, e, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, again := range []*election.Election{e, newElection(t, l, "twice")} {
		start := time.Now()
		_, err := again.Campaign(ctx, "a")
		if !errors.Is(err, election.ErrLeading) || !strings.Contains(err.Error(), "already leads") {
			t.Fatalf("second Campaign = %v after %v, want ErrLeading", err, time.Since(start))
		}
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	next := mustCampaign(t, e, "a")
	if next.Fence().Token <= term.Fence().Token {
		t.Fatalf("next term's token %d not above %d", next.Fence().Token, term.Fence().Token)
	}
	_ = next.Resign(ctx)
}

// Proclaim changes the leader's value within its term: Leader and Observe
// report it with the term's token; a deposed term's Proclaim is refused
// and changes nothing.
func TestProclaim(t *testing.T) {
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watcher := newElection(t, newLocker(t, c, prefix), "proclaim")
	ea := newElection(t, newLocker(t, c, prefix), "proclaim")
	eb := newElection(t, newLocker(t, c, prefix), "proclaim")

	a := mustCampaign(t, ea, "a:1")
	octx, ocancel := context.WithCancel(ctx)
	o := observe(octx, t, c, watcher)
	o.waitFor(t, a.Fence().Token)
	for _, v := range []string{"a:2", "a:3"} {
		if err := a.Proclaim(ctx, v); err != nil {
			t.Fatalf("Proclaim(%q): %v", v, err)
		}
		got, err := watcher.Leader(ctx)
		if err != nil || got != (election.Leader{Value: v, Token: a.Fence().Token}) {
			t.Fatalf("Leader after Proclaim(%q) = %+v, %v", v, got, err)
		}
	}
	if a.Value() != "a:3" || a.Fence().Token == 0 {
		t.Fatalf("term's value %q after Proclaim", a.Value())
	}
	if err := a.Proclaim(ctx, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Proclaim of an empty value = %v, want fence.ErrInvalid", err)
	}
	bc := campaignAsync(ctx, eb, "b:1")
	waitQueued(t, c, newLocker(t, c, prefix), "proclaim", 1)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ob := <-bc
	if ob.err != nil {
		t.Fatal(ob.err)
	}
	if err := a.Proclaim(ctx, "a:4"); !errors.Is(err, election.ErrResigned) {
		t.Fatalf("Proclaim after Resign = %v, want ErrResigned", err)
	}
	if got, err := watcher.Leader(ctx); err != nil || got.Value != "b:1" {
		t.Fatalf("Leader after a deposed Proclaim = %+v, %v", got, err)
	}
	seen := o.waitFor(t, ob.term.Fence().Token)
	want := []election.Leader{{Value: "a:1", Token: a.Fence().Token}, {Value: "a:2", Token: a.Fence().Token}, {Value: "a:3", Token: a.Fence().Token}, {Value: "b:1", Token: ob.term.Fence().Token}}
	if len(seen) != len(want) {
		t.Fatalf("observer saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("observer saw %v, want %v", seen, want)
		}
	}
	ocancel()
	<-o.done
	_ = ob.term.Resign(ctx)
}

// A term whose lock was taken from it (its lease lost at Redis) cannot
// proclaim: the record is left as it was.
func TestProclaimOfALostTerm(t *testing.T) {
	c := testenv.Redis(t)
	l := newLocker(t, c, "")
	e := newElection(t, l, "lostproclaim")
	term := mustCampaign(t, e, "a")
	// The lock key is deleted behind the term's back: as Redis losing it.
	if err := c.Del(context.Background(), keysOf(l).LockKey("lostproclaim")).Err(); err != nil {
		t.Fatal(err)
	}
	err := term.Proclaim(context.Background(), "b")
	if !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Proclaim of a term whose lock is gone = %v, want lock.ErrNotHeld", err)
	}
	if v, _ := c.HGet(context.Background(), electionKeys(e).RecordKey, "v").Result(); v != "a" {
		t.Fatalf("record's value %q after a refused Proclaim", v)
	}
}
