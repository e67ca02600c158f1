package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

const hour = time.Hour

// TestExpiryKeepsMark checks that an expired value reads as missing, counts
// as a delete in the version, and leaves the high-water mark in force.
func TestExpiryKeepsMark(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	if _, err := s.FencedSet(ctx, fen(5, "a"), "k", []byte("v"), WithTTL(250*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	v, err := s.Load(ctx, "k")
	if err != nil || !v.Exists || v.ExpiresAt.IsZero() {
		t.Fatalf("Load before expiry = %+v, %v; want a live value with an expiry", v, err)
	}
	if ttl := c.PTTL(ctx, s.Prefix()+"k").Val(); ttl != -1 {
		t.Fatalf("key lifetime %v; want none, so the mark outlives the value", ttl)
	}
	eventually(t, 5*time.Second, "value expiry", func() bool {
		_, err := s.Load(ctx, "k")
		return errors.Is(err, fence.ErrNotFound)
	})
	if v, _ := s.Load(ctx, "k"); v.Version != 2 {
		t.Fatalf("version after expiry = %d, want 2 (expiry counts as a delete)", v.Version)
	}
	if _, err := s.FencedSet(ctx, fen(4, "z"), "k", []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older holder's write after expiry: %v; want ErrStale", err)
	}
	if _, err := s.FencedGet(ctx, fen(5, "a"), "k"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("fenced read after expiry: %v; want ErrNotFound", err)
	}
	if n := c.HExists(ctx, s.Prefix()+"k", "v").Val(); n {
		t.Fatal("fenced read left the expired bytes in the hash")
	}
	if ver, err := s.CompareAndSet(ctx, "k", 2, []byte("again")); err != nil || ver != 3 {
		t.Fatalf("compare-and-set at the post-expiry version = %d, %v; want 3", ver, err)
	}
	// A write without a TTL makes the value permanent again.
	if _, err := s.FencedSet(ctx, fen(5, "a"), "p", []byte("x"), WithTTL(hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, fen(5, "a"), "p", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Load(ctx, "p"); err != nil || !v.ExpiresAt.IsZero() {
		t.Fatalf("Load after a write without TTL = %+v, %v; want no expiry", v, err)
	}
}

// TestMarkRetention checks the documented trade-off of WithMarkRetention:
// the hash of a key without a live value goes after the retention, and with
// it the mark, so that an old fence is admitted again.
func TestMarkRetention(t *testing.T) {
	t.Parallel()
	// The shortest retention a store accepts: its retry window, at least 1s.
	const retention = time.Second
	s, c := newShortStore(t, WithMarkRetention(retention), WithRetryWindow(retention))
	ctx := context.Background()
	pttl := func(key string) time.Duration { return c.PTTL(ctx, s.Prefix()+key).Val() }

	if _, err := s.FencedSet(ctx, fen(5, "a"), "live", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := pttl("live"); d != -1 {
		t.Fatalf("live value without TTL has key lifetime %v; want none", d)
	}
	if err := s.FencedDelete(ctx, fen(5, "a"), "live"); err != nil {
		t.Fatal(err)
	}
	if d := pttl("live"); d <= 0 || d > retention {
		t.Fatalf("deleted key lifetime %v; want within (0, %v]", d, retention)
	}
	if _, err := s.FencedGet(ctx, fen(1, "a"), "missing"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	if d := pttl("missing"); d <= 0 || d > retention {
		t.Fatalf("mark-only key lifetime %v; want within (0, %v]", d, retention)
	}
	// Each operation that finds no value restarts the retention, so that a
	// holder between its fenced read and its write keeps its mark.
	time.Sleep(60 * time.Millisecond) // let the retention run down
	before := pttl("missing")
	if _, err := s.FencedGet(ctx, fen(2, "b"), "missing"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	if after := pttl("missing"); after <= before {
		t.Fatalf("fenced read left the mark-only key's lifetime at %v (was %v); want it restarted", after, before)
	}

	if _, err := s.FencedSet(ctx, fen(5, "a"), "k", []byte("v"), WithTTL(30*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	valueExpiry, err := c.HGet(ctx, s.Prefix()+"k", "exp").Int64() // the stored field, in ms
	if err != nil {
		t.Fatal(err)
	}
	keyExpiry := c.PExpireTime(ctx, s.Prefix()+"k").Val()
	if want := time.Duration(valueExpiry)*time.Millisecond + retention; keyExpiry != want {
		t.Fatalf("expiring value's key expires at %v; want the value's expiry %v plus retention", keyExpiry, valueExpiry)
	}
	if _, err := s.FencedSet(ctx, fen(4, "z"), "k", []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older holder's write within retention: %v; want ErrStale", err)
	}
	eventually(t, 5*time.Second, "key collection", func() bool {
		return c.Exists(ctx, s.Prefix()+"k").Val() == 0
	})
	// The trade-off: with the mark gone, an old fence is admitted.
	if _, err := s.FencedSet(ctx, fen(4, "z"), "k", []byte("late")); err != nil {
		t.Fatalf("write after the mark was collected: %v; want it admitted", err)
	}
}
