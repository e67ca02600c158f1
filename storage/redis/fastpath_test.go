package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// The fenced script answers a call under the key's mark before its helpers
// are made (fenced_fast.lua). These pin the cases it must hand on to the
// full script: a retention to change, and a value with an expiry.

func TestSetUnderTheMarkKeepsTheLongestRetention(t *testing.T) {
	ctx := context.Background()
	c := noRetryClient(t)
	prefix := testenv.Prefix(t)
	store := func(opts ...Option) *Store {
		s, err := New(c, append([]Option{WithPrefix(prefix), WithRetryWindow(time.Second)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	second, hour, forever := store(WithMarkRetention(time.Second)), store(WithMarkRetention(time.Hour)), store()
	f := fen(5, "a")
	rt := func() string { return c.HGet(ctx, prefix+"k", "rt").Val() }
	for _, step := range []struct {
		name string
		s    *Store
		want string
	}{
		{"a 1s-retention store's first write", second, "1000"},
		{"the same write again", second, "1000"},
		{"a 1h-retention store's write under the same mark", hour, "3600000"},
		{"a 1s-retention store's write after it", second, "3600000"},
		{"the write of a store that keeps marks for ever", forever, ""},
		{"a 1h-retention store's write after it", hour, ""},
	} {
		if _, err := step.s.FencedSet(ctx, f, "k", []byte(step.name)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := rt(); got != step.want {
			t.Fatalf("after %s the hash's retention is %q; want %q", step.name, got, step.want)
		}
		if v, err := step.s.FencedGet(ctx, f, "k"); err != nil || string(v.Data) != step.name {
			t.Fatalf("after %s: read %q, %v", step.name, v.Data, err)
		}
	}
}

func TestReadUnderTheMarkSeesTheExpiry(t *testing.T) {
	ctx := context.Background()
	s, _ := newShortStore(t)
	f := fen(5, "a")
	if _, err := s.FencedSet(ctx, f, "k", []byte("v"), WithTTL(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value expired", func() bool {
		_, err := s.FencedGet(ctx, f, "k")
		return errors.Is(err, fence.ErrNotFound)
	})
	v, err := s.FencedSet(ctx, f, "k", []byte("w"))
	if err != nil {
		t.Fatal(err)
	}
	// Written, expired (a version of its own), written again.
	if v != 3 {
		t.Fatalf("version %d after a write, an expiry and a write; want 3", v)
	}
}
