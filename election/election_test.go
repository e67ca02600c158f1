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

func TestCampaignLeaderResign(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ea := newElection(t, newLocker(t, c, prefix), "sched")
	eb := newElection(t, newLocker(t, c, prefix), "sched")

	if _, err := ea.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader before any term: %v, want ErrNoLeader", err)
	}
	a := mustCampaign(t, ea, "a:8080")
	if f := a.Fence(); f.Resource != "sched" || f.Token == 0 || f.Holder == "" {
		t.Fatalf("fence %+v", f)
	}
	for _, e := range []*election.Election{ea, eb} {
		got, err := e.Leader(ctx)
		if err != nil || got != (election.Leader{Value: "a:8080", Token: a.Fence().Token}) {
			t.Fatalf("Leader = %+v, %v; want a's term", got, err)
		}
	}

	bc := campaignAsync(ctx, eb, "b:8080")
	waitQueued(t, c, newLocker(t, c, prefix), "sched", 1)
	select {
	case o := <-bc:
		t.Fatalf("b elected while a leads: %+v", o)
	default:
	}
	if !a.Leading() || a.Err() != nil {
		t.Fatalf("a no longer leads before resigning: %v", a.Err())
	}
	// a's term lasts past several renewals.
	time.Sleep(2 * testTTL)
	if a.Err() != nil {
		t.Fatalf("a's term ended while renewed: %v", a.Err())
	}

	resigned := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done still open after Resign returned")
	}
	if !errors.Is(a.Err(), election.ErrResigned) || a.Leading() {
		t.Fatalf("a.Err() = %v, Leading %v", a.Err(), a.Leading())
	}
	var o outcome
	select {
	case o = <-bc:
	case <-time.After(10 * time.Second):
		t.Fatal("b not elected 10s after a resigned")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	b := o.term
	t.Cleanup(func() { _ = b.Resign(ctx) })
	// The hand-over is the release's own grant, not a lease's expiry.
	if took := o.at.Sub(resigned); took >= testTTL {
		t.Errorf("b elected %v after a resigned: not a hand-over (TTL %v)", took, testTTL)
	}
	if b.Fence().Token <= a.Fence().Token {
		t.Fatalf("b's token %d not above a's %d", b.Fence().Token, a.Fence().Token)
	}
	got, err := ea.Leader(ctx)
	if err != nil || got != (election.Leader{Value: "b:8080", Token: b.Fence().Token}) {
		t.Fatalf("Leader after hand-over = %+v, %v", got, err)
	}
	// Resigning again changes nothing.
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ea.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after the last resignation: %v, want ErrNoLeader", err)
	}
}

func TestCampaignCancelled(t *testing.T) {
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ea := newElection(t, newLocker(t, c, prefix), "sched")
	eb := newElection(t, newLocker(t, c, prefix), "sched")
	a := mustCampaign(t, ea, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := eb.Campaign(ctx, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign with an ended context: %v", err)
	}
	if err := a.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	// b left nothing behind: a third candidate is elected at once.
	c3 := mustCampaign(t, newElection(t, newLocker(t, c, prefix), "sched"), "c")
	if got, _ := ea.Leader(context.Background()); got.Value != "c" {
		t.Fatalf("Leader = %+v, want c", got)
	}
	_ = c3.Resign(context.Background())
}

// The step-down margin is a quarter of the TTL unless set, and a set one
// is kept whatever the options' order.
func TestStepDownMargin(t *testing.T) {
	l := newLocker(t, testenv.Redis(t), "")
	for _, tc := range []struct {
		opts []election.Option
		want time.Duration
	}{
		{nil, election.DefaultTTL / 4},
		{[]election.Option{election.WithTTL(400 * time.Millisecond)}, 100 * time.Millisecond},
		{[]election.Option{election.WithStepDown(3 * time.Second), election.WithTTL(8 * time.Second)}, 3 * time.Second},
		{[]election.Option{election.WithTTL(8 * time.Second), election.WithStepDown(82 * time.Millisecond)}, 82 * time.Millisecond},
	} {
		e, err := election.New(l, "margin", tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.StepDown(); got != tc.want {
			t.Errorf("StepDown() = %v with TTL %v, want %v", got, e.TTL(), tc.want)
		}
	}
}

func TestBadInput(t *testing.T) {
	l := newLocker(t, testenv.Redis(t), "")
	e := newElection(t, l, "ok")
	ctx := context.Background()
	fn := func(context.Context, fence.Fence) error { return nil }
	var nilCtx context.Context
	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"nil Locker", "election: New: invalid argument: nil Locker", func() error { _, err := election.New(nil, "x"); return err }},
		{"empty name", "election: New: invalid argument: empty name", func() error { _, err := election.New(l, ""); return err }},
		{"brace", "election: New: invalid argument: name \"a{b\" contains a brace", func() error { _, err := election.New(l, "a{b"); return err }},
		{"long name", "election: New: invalid argument: name of 1025 bytes", func() error { _, err := election.New(l, strings.Repeat("x", 1025)); return err }},
		{"bad utf8 name", "election: New: invalid argument: name", func() error { _, err := election.New(l, "\xff"); return err }},
		{"zero TTL", "election: WithTTL: invalid argument: non-positive TTL 0s", func() error { _, err := election.New(l, "x", election.WithTTL(0)); return err }},
		{"negative TTL", "election: WithTTL: invalid argument: non-positive TTL -1s", func() error { _, err := election.New(l, "x", election.WithTTL(-time.Second)); return err }},
		{"tiny TTL", "election: WithTTL: invalid argument: TTL 1ms is shorter than 100ms", func() error { _, err := election.New(l, "x", election.WithTTL(time.Millisecond)); return err }},
		{"TTL below the floor", "election: WithTTL: invalid argument: TTL 10ms is shorter than 100ms", func() error { _, err := election.New(l, "x", election.WithTTL(10*time.Millisecond)); return err }},
		{"zero step-down", "election: WithStepDown: invalid argument: non-positive step-down margin 0s", func() error { _, err := election.New(l, "x", election.WithStepDown(0)); return err }},
		{"step-down below drift", "election: WithStepDown: invalid argument: step-down margin 1ms is below the clock-drift allowance 6ms of the TTL 400ms", func() error {
			_, err := election.New(l, "x", election.WithStepDown(time.Millisecond), election.WithTTL(400*time.Millisecond))
			return err
		}},
		{"step-down over half the TTL", "election: WithStepDown: invalid argument: step-down margin 6s is more than half the TTL 10s", func() error { _, err := election.New(l, "x", election.WithStepDown(6*time.Second)); return err }},
		{"huge TTL", "election: WithTTL: invalid argument: TTL", func() error { _, err := election.New(l, "x", election.WithTTL(lock.MaxTTL+time.Hour)); return err }},
		{"nil meter", "election: WithMeterProvider: invalid argument: nil MeterProvider", func() error { _, err := election.New(l, "x", election.WithMeterProvider(nil)); return err }},
		{"empty value", "election: Campaign: invalid argument: empty value", func() error { _, err := e.Campaign(ctx, ""); return err }},
		{"long value", "election: Campaign: invalid argument: value of 4097 bytes", func() error { _, err := e.Campaign(ctx, strings.Repeat("v", 4097)); return err }},
		{"bad utf8 value", "election: Campaign: invalid argument: value is not valid UTF-8", func() error { _, err := e.Campaign(ctx, "\xff"); return err }},
		{"nil ctx", "election: Campaign: invalid argument: nil context", func() error { _, err := e.Campaign(nilCtx, "v"); return err }},
		{"Leader nil ctx", "election: Leader: invalid argument: nil context", func() error { _, err := e.Leader(nilCtx); return err }},
		{"Run nil election", "election: Run: invalid argument: nil Election", func() error { return election.Run(ctx, nil, "v", fn) }},
		{"Run nil fn", "election: Run: invalid argument: nil function", func() error { return election.Run(ctx, e, "v", nil) }},
		{"Run empty value", "election: Run: invalid argument: empty value", func() error { return election.Run(ctx, e, "", fn) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error matching fence.ErrInvalid starting %q", err, tc.want)
			}
		})
	}
	// Nothing was sent: nobody leads, and no key of the election exists.
	if _, err := e.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after bad input: %v", err)
	}
}
