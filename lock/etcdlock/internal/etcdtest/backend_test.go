package etcdtest

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// TestTokensIncreaseAboveClockTokens checks that grants of one resource get
// strictly increasing tokens, all above the clock-anchored tokens of the
// Redis and PostgreSQL locks (microseconds since 1970), so that a resource
// moved from those locks keeps being admitted.
func TestTokensIncreaseAboveClockTokens(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	clockToken := fence.Token(time.Now().UnixMicro())
	var last fence.Token
	for i := range 20 {
		out := mustGrant(t, b, req("res", 5*time.Second))
		if out.Token <= last {
			t.Fatalf("grant %d: token %d after %d", i, out.Token, last)
		}
		if out.Token <= clockToken || out.Token > fence.MaxToken {
			t.Fatalf("grant %d: token %d not between a clock token (%d) and MaxToken", i, out.Token, clockToken)
		}
		if out.Known <= 0 || out.Known >= 5*time.Second {
			t.Fatalf("grant %d: known %v, want below the TTL asked", i, out.Known)
		}
		last = out.Token
		if err := b.Release(ctxFor(t, 5*time.Second), out.Hold); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExclusiveAndRelease checks that a held lock refuses another holder,
// that a release frees it, and that a second release says not held.
func TestExclusiveAndRelease(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	a := mustGrant(t, b, req("x", 5*time.Second))
	out, err := b.Try(ctxFor(t, 5*time.Second), req("x", 5*time.Second))
	if err != nil || out.Granted {
		t.Fatalf("second Try while held: granted=%v err=%v", out.Granted, err)
	}
	if d, err := b.TTL(ctxFor(t, 5*time.Second), a.Hold); err != nil || d <= 0 || d > 5*time.Second {
		t.Fatalf("TTL: %v %v", d, err)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctxFor(t, 5*time.Second), a.Hold); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if _, err := b.Extend(ctxFor(t, 5*time.Second), a.Hold, 5*time.Second); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("Extend after Release: %v, want ErrNotHeld", err)
	}
	mustGrant(t, b, req("x", 5*time.Second))
}

// TestRetryOfGrantReturnsIt checks that a try repeated by the same holder
// after it was granted returns that grant, not a refusal.
func TestRetryOfGrantReturnsIt(t *testing.T) {
	c := sharedCluster(t)
	b := newBackend(t, c.Client(t))
	r := req("retry", 5*time.Second)
	a := mustGrant(t, b, r)
	again := mustGrant(t, b, r)
	if again.Token != a.Token {
		t.Fatalf("retry's token %d, first %d", again.Token, a.Token)
	}
}

// TestBadSettingsRefused checks that options meaningless on etcd are
// refused as invalid arguments.
func TestBadSettingsRefused(t *testing.T) {
	c := sharedCluster(t)
	cli := c.Client(t)
	for _, s := range []lockbackend.Settings{
		{Given: lockbackend.GivenRetention, Retention: time.Hour},
		{Given: lockbackend.GivenNodeTimeout, NodeTimeout: time.Second},
		{Prefix: "a{b}"},
	} {
		if _, err := backend.New(cli, s); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("New(%+v): %v, want fence.ErrInvalid", s, err)
		}
	}
	if _, err := backend.New(nil, lockbackend.Settings{}); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil): %v", err)
	}
}
