package election_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

func TestRunReturnsFnError(t *testing.T) {
	c := testenv.Redis(t)
	e := newElection(t, newLocker(t, c, ""), "run")
	boom := errors.New("boom")
	var got fence.Fence
	err := election.Run(context.Background(), e, "a", func(ctx context.Context, f fence.Fence) error {
		got = f
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want fn's error", err)
	}
	if got.Token == 0 || got.Resource != "run" {
		t.Fatalf("fn got fence %+v", got)
	}
	// Run resigned on its way out.
	if _, err := e.Leader(context.Background()); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after Run returned: %v, want ErrNoLeader", err)
	}
}

func TestRunPanicResigns(t *testing.T) {
	c := testenv.Redis(t)
	e := newElection(t, newLocker(t, c, ""), "run")
	defer func() {
		if r := recover(); r != "fn panicked" {
			t.Fatalf("recovered %v", r)
		}
		if _, err := e.Leader(context.Background()); !errors.Is(err, election.ErrNoLeader) {
			t.Fatalf("Leader after fn panicked: %v, want ErrNoLeader", err)
		}
	}()
	_ = election.Run(context.Background(), e, "a", func(context.Context, fence.Fence) error { panic("fn panicked") })
	t.Fatal("Run returned instead of panicking")
}

// TestRunHandsOverAndStops runs two candidates: each term resigns when fn
// returns, so the other, queued, leads next; cancelling Run's context ends
// it with ctx's error.
func TestRunHandsOverAndStops(t *testing.T) {
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var order []string
	errs := make(chan error, 2)
	for _, name := range []string{"a", "b"} {
		l := newLocker(t, c, prefix)
		e := newElection(t, l, "run")
		queue := keysOf(l).LockKey("run")
		queue = queue[:len(queue)-len(":lock")] + ":queue"
		go func() {
			errs <- election.Run(ctx, e, name, func(ctx context.Context, f fence.Fence) error {
				mu.Lock()
				order = append(order, name)
				n := len(order)
				mu.Unlock()
				if n >= 6 {
					<-ctx.Done()
					return ctx.Err()
				}
				// Resign only once the other candidate is queued, whatever
				// the machine's load: then the hand-over must go to it.
				for deadline := time.Now().Add(10 * time.Second); c.ZCard(ctx, queue).Val() < 1; time.Sleep(time.Millisecond) {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if time.Now().After(deadline) {
						return errors.New("the other candidate not queued after 10s")
					}
				}
				return nil
			})
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(order)
		mu.Unlock()
		if n >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d terms in 10s", n)
		}
	}
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel = %v, want context.Canceled", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(order); i++ {
		if order[i] == order[i-1] {
			t.Fatalf("terms %v: a candidate led twice in a row while the other was queued", order)
		}
	}
}

// TestRunLossEndsContext cuts a Run leader off from Redis: fn's context
// ends, with the term's loss as its cause, before the other candidate is
// elected, and Run campaigns again (it leads again once the other resigns).
func TestRunLossEndsContext(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	ca := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = ca.Close() })
	ea := newElection(t, newLocker(t, ca, "el:"), "run")
	eb := newElection(t, newLocker(t, srv.Client(), "el:"), "run")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type ended struct {
		at    time.Time
		cause error
	}
	terms := make(chan fence.Fence, 4)
	ends := make(chan ended, 4)
	runErr := make(chan error, 1)
	go func() {
		runErr <- election.Run(ctx, ea, "a", func(ctx context.Context, f fence.Fence) error {
			terms <- f
			<-ctx.Done()
			ends <- ended{time.Now(), context.Cause(ctx)}
			return ctx.Err()
		})
	}()
	first := <-terms
	bc := campaignAsync(ctx, eb, "b")
	waitQueued(t, srv.Client(), newLocker(t, srv.Client(), "el:"), "run", 1)
	proxy.Block()
	end := <-ends
	o := <-bc
	if o.err != nil {
		t.Fatal(o.err)
	}
	if !errors.Is(end.cause, election.ErrLost) {
		t.Fatalf("fn's context cause = %v, want ErrLost", end.cause)
	}
	if !end.at.Before(o.at) {
		t.Fatalf("fn's context ended %v after b was elected", end.at.Sub(o.at))
	}
	proxy.Unblock()
	// a campaigns again, queued behind b; b's resignation hands it over.
	waitQueued(t, srv.Client(), newLocker(t, srv.Client(), "el:"), "run", 1)
	if err := o.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-terms:
		if f.Token <= o.term.Fence().Token || f.Token <= first.Token {
			t.Fatalf("a's second term has token %d, after %d and %d", f.Token, first.Token, o.term.Fence().Token)
		}
	case err := <-runErr:
		t.Fatalf("Run returned %v after its term was lost", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a did not lead again within 10s")
	}
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

// TestRunRetriesUnreachableRedis starts Run while Redis is down: it keeps
// campaigning rather than returning, and leads once Redis is back.
func TestRunRetriesUnreachableRedis(t *testing.T) {
	testenv.Slow(t)
	redis.SetLogger(quietLogger{})
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	e := newElection(t, newLocker(t, c, "el:"), "run")
	srv.Kill()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	led := make(chan fence.Fence, 1)
	runErr := make(chan error, 1)
	go func() {
		runErr <- election.Run(ctx, e, "a", func(ctx context.Context, f fence.Fence) error {
			led <- f
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	select {
	case err := <-runErr:
		t.Fatalf("Run returned %v while Redis was down", err)
	case <-led:
		t.Fatal("led while Redis was down")
	case <-time.After(500 * time.Millisecond):
	}
	srv.Restart()
	select {
	case <-led:
	case err := <-runErr:
		t.Fatalf("Run returned %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no term 10s after Redis came back")
	}
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
}
