package redis

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestOneCommandPerOperation counts, with a go-redis hook, the commands each
// operation sends once the scripts are loaded: exactly one, a script call,
// whether the operation is admitted or refused.
func TestOneCommandPerOperation(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	h := &testenv.Commands{}
	c.AddHook(h)
	a, b := fen(2, "a"), fen(1, "b")
	ops := []struct {
		name string
		run  func() error
	}{
		{"fenced read of a missing key", func() error { _, err := s.FencedGet(ctx, a, "k"); return ignore(err, fence.ErrNotFound) }},
		{"fenced write", func() error { _, err := s.FencedSet(ctx, a, "k", []byte("v")); return err }},
		{"fenced write with ttl", func() error { _, err := s.FencedSet(ctx, a, "k", []byte("v"), WithTTL(hour)); return err }},
		{"fenced read", func() error { _, err := s.FencedGet(ctx, a, "k"); return err }},
		{"stale fenced write", func() error { _, err := s.FencedSet(ctx, b, "k", []byte("x")); return ignore(err, fence.ErrStale) }},
		{"stale fenced read", func() error { _, err := s.FencedGet(ctx, b, "k"); return ignore(err, fence.ErrStale) }},
		{"version-checked fenced write", func() error { _, err := s.FencedSetIfVersion(ctx, a, "k", 2, []byte("w")); return err }},
		{"conflicting fenced write", func() error {
			_, err := s.FencedSetIfVersion(ctx, a, "k", 1, []byte("w"))
			return ignore(err, fence.ErrConflict)
		}},
		{"load", func() error { _, err := s.Load(ctx, "k"); return err }},
		{"high-water mark", func() error { _, err := s.HighWater(ctx, "k"); return err }},
		{"compare-and-set", func() error { _, err := s.CompareAndSet(ctx, "k", 3, []byte("c")); return err }},
		{"conflicting compare-and-set", func() error {
			_, err := s.CompareAndSet(ctx, "k", 0, []byte("c"))
			return ignore(err, fence.ErrConflict)
		}},
		{"compare-and-delete", func() error { _, err := s.CompareAndDelete(ctx, "k", 4); return err }},
		{"fenced delete", func() error { return s.FencedDelete(ctx, a, "k") }},
	}
	for _, op := range ops {
		h.Take()
		if err := op.run(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		sent := h.Take()
		if len(sent) != 1 || sent[0] != "evalsha" {
			t.Errorf("%s sent %v; want one script call", op.name, sent)
		}
	}
	// Update is a fenced read and a fenced write: two round trips, by design.
	h.Take()
	if _, err := s.FencedUpdate(ctx, a, "k", func(Value) ([]byte, error) { return []byte("u"), nil }); err != nil {
		t.Fatal(err)
	}
	if sent := h.Take(); len(sent) != 2 {
		t.Errorf("Update sent %v; want a fenced read and a fenced write", sent)
	}
}

func ignore(err, want error) error {
	if errors.Is(err, want) {
		return nil
	}
	if err == nil {
		return errors.New("no error, want " + want.Error())
	}
	return err
}

// TestFirstCallLoadsScript checks, on a fresh server that has no scripts
// cached, that the first call of an operation still works (EVALSHA, then
// EVAL) and that the next one is a single command again.
func TestFirstCallLoadsScript(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	h := &testenv.Commands{}
	c.AddHook(h)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // open the connection first
		t.Fatal(err)
	}
	h.Take()
	if _, err := s.FencedSet(ctx, fen(1, "a"), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if sent := h.Take(); len(sent) != 2 || sent[0] != "evalsha" || sent[1] != "eval" {
		t.Fatalf("first call sent %v; want evalsha, eval", sent)
	}
	if _, err := s.FencedSet(ctx, fen(1, "a"), "k", []byte("w")); err != nil {
		t.Fatal(err)
	}
	if sent := h.Take(); len(sent) != 1 {
		t.Fatalf("second call sent %v; want one command", sent)
	}
}
