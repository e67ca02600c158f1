package observe_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/fencekit/fencekit/election"
)

// TestElectionReportsLeadingTermsAndCampaigns checks the election's
// instruments with the SDK installed as the global providers: whether this
// process leads, terms by outcome, and a span per campaign with its token.
func TestElectionReportsLeadingTermsAndCampaigns(t *testing.T) {
	ctx := context.Background()
	leading := func() int64 { return count(t, "fencekit.election.leading") }
	terms := func(o string) int64 { return count(t, "fencekit.election.terms", outcome(o)) }
	won, resigned, lost := terms("won"), terms("resigned"), terms("lost")
	base := leading()

	l := newLocker(t)
	e, err := election.New(l, "observed-election", election.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	term, err := e.Campaign(ctx, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := leading() - base; got != 1 {
		t.Fatalf("leading while leading = %d, want 1", got)
	}
	s := findSpan(t, "fencekit.election.campaign", attribute.String("fencekit.resource", "observed-election"),
		attribute.Int64("fencekit.token", int64(term.Fence().Token)))
	if s.Status().Code != 0 && s.Status().Description != "" {
		t.Fatalf("campaign span status %v", s.Status())
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got := leading() - base; got != 0 {
		t.Fatalf("leading after resigning = %d, want 0", got)
	}

	// A term whose renewals stop (its Locker closed, as in a crash) is lost.
	l2 := newLocker(t)
	e2, err := election.New(l2, "observed-election-2", election.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t2, err := e2.Campaign(ctx, "host-b")
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
	<-t2.Done()
	if got := terms("won") - won; got != 2 {
		t.Errorf("terms won = %d, want 2", got)
	}
	if got := terms("resigned") - resigned; got != 1 {
		t.Errorf("terms resigned = %d, want 1", got)
	}
	if got := terms("lost") - lost; got != 1 {
		t.Errorf("terms lost = %d, want 1", got)
	}
	if got := leading() - base; got != 0 {
		t.Errorf("leading after the loss = %d, want 0", got)
	}
}
