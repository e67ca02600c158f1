package election_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// lostTTL is the lease of the lost-term tests: long enough that waiting
// out one (as Resign after a lost term used to) stands far above their
// bounds.
const lostTTL = 2 * time.Second

// Resign after the term was lost (its leader cut off from Redis, which
// holds the lost term's release) returns by its context, and Run, whose
// deferred Resign runs then, returns soon after its context ends.
func TestResignAfterALostTermReturnsByItsContext(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	c, proxy := silentClient(t, srv.Addr())
	t.Cleanup(proxy.Unblock)
	e := newElection(t, newLocker(t, c, "el:"), "lost", election.WithTTL(lostTTL))

	term := mustCampaign(t, e, "a")
	proxy.Block()
	select {
	case <-term.Done():
	case <-time.After(3 * lostTTL):
		t.Fatal("the cut-off term did not end")
	}
	const resignTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), resignTimeout)
	defer cancel()
	start := time.Now()
	err := term.Resign(ctx)
	took := time.Since(start)
	t.Logf("Resign after a lost term (TTL %v) with a %v context: %v (%v)", lostTTL, resignTimeout, took.Round(time.Millisecond), err)
	if took > resignTimeout+silentMargin {
		t.Errorf("Resign took %v with a %v context", took.Round(time.Millisecond), resignTimeout)
	}
	proxy.Unblock()

	// Run: its term is lost, fn returns, and Run's context ends then.
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	lost := make(chan time.Time, 1)
	runErr := make(chan error, 1)
	f := newElection(t, newLocker(t, c, "el:"), "lost-run", election.WithTTL(lostTTL))
	go func() {
		runErr <- election.Run(rctx, f, "a", func(ctx context.Context, _ fence.Fence) error {
			proxy.Block()
			<-ctx.Done()
			lost <- time.Now()
			rcancel()
			return ctx.Err()
		})
	}()
	var at time.Time
	select {
	case at = <-lost:
	case <-time.After(3 * lostTTL):
		t.Fatal("Run's term was not lost")
	}
	err = <-runErr
	took = time.Since(at)
	t.Logf("Run returned %v after its lost term's fn returned and its context ended: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if took > silentMargin {
		t.Errorf("Run returned %v after its context ended, held by the lost term's resignation", took.Round(time.Millisecond))
	}
}

// Campaign on a closed Locker, which renews nothing, refuses with an error
// that says so rather than winning a term that nobody renews.
func TestCampaignAfterLockerClose(t *testing.T) {
	l := newLocker(t, testenv.Redis(t), "")
	e := newElection(t, l, "closed")
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	term, err := e.Campaign(ctx, "a")
	if err == nil {
		_ = term.Resign(ctx)
		t.Fatalf("Campaign on a closed Locker won term %d", term.Fence().Token)
	}
	if !errors.Is(err, election.ErrClosed) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Campaign on a closed Locker = %v, want ErrClosed", err)
	}
	err = election.Run(ctx, e, "a", func(context.Context, fence.Fence) error { return nil })
	if !errors.Is(err, election.ErrClosed) {
		t.Fatalf("Run on a closed Locker = %v, want ErrClosed", err)
	}
}

// A stale refusal returned by fn (a deposed leader's write refused by
// storage) ends the term, not Run: Run campaigns again.
func TestRunCampaignsAgainAfterAStaleRefusal(t *testing.T) {
	e := newElection(t, newLocker(t, testenv.Redis(t), ""), "stale")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tokens []fence.Token
	err := election.Run(ctx, e, "a", func(_ context.Context, f fence.Fence) error {
		tokens = append(tokens, f.Token)
		if len(tokens) == 1 {
			return fmt.Errorf("write refused: %w", &fence.StaleError{Fence: f, HighWater: fence.Fence{Resource: f.Resource, Token: f.Token + 1, Holder: "newer"}})
		}
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v after fn's stale refusal, want it to campaign again until cancelled (fn ran %d times)", err, len(tokens))
	}
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("terms %v, want two, the second with a higher token", tokens)
	}
}
