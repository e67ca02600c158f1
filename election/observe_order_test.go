package election_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestObserveNeverGoesBack: an announcement of an older term arriving after
// a newer term was observed (a late or replayed message on the record's
// channel) is passed over: observers see terms in token order only.
func TestObserveNeverGoesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := testenv.Redis(t)
	l := newLocker(t, c, "")
	e := newElection(t, l, "ordered")
	obs := e.Observe(ctx)
	first := mustCampaign(t, e, "first")
	old := first.Fence().Token
	next := func(what string) election.Leader {
		t.Helper()
		select {
		case ld := <-obs:
			return ld
		case <-ctx.Done():
			t.Fatalf("no leader observed: %s", what)
		}
		return election.Leader{}
	}
	for ld := next("the first term"); ld.Token != old; ld = next("the first term") {
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second := mustCampaign(t, e, "second")
	for ld := next("the second term"); ld.Token != second.Fence().Token; ld = next("the second term") {
	}
	// A late announcement of the first term.
	if err := c.Publish(ctx, electionKeys(e).Channel, fmt.Sprintf("%d first", old)).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case ld := <-obs:
		if ld.Token < second.Fence().Token {
			t.Fatalf("observed term %d (%s) after term %d", ld.Token, ld.Value, second.Fence().Token)
		}
	case <-time.After(time.Second):
	}
	_ = second.Resign(ctx)
}
