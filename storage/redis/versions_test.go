package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

func TestCompareAndSet(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	ver, err := s.CompareAndSet(ctx, "k", 0, []byte("one"))
	if err != nil || ver != 1 {
		t.Fatalf("create = %d, %v; want version 1", ver, err)
	}
	_, err = s.CompareAndSet(ctx, "k", 0, []byte("again"))
	var ce *fence.ConflictError
	if !errors.Is(err, fence.ErrConflict) || !errors.As(err, &ce) || ce.Key != "k" || ce.Expected != 0 || ce.Actual != 1 {
		t.Fatalf("second create: %v; want a conflict expecting 0, finding 1", err)
	}
	if ver, err = s.CompareAndSet(ctx, "k", 1, []byte("two")); err != nil || ver != 2 {
		t.Fatalf("update = %d, %v; want version 2", ver, err)
	}
	before := rawState(t, c, s.Prefix()+"k")
	if _, err := s.CompareAndDelete(ctx, "k", 1); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("delete at an old version: %v; want ErrConflict", err)
	}
	if rawState(t, c, s.Prefix()+"k") != before {
		t.Fatal("refused delete changed the key")
	}
	if ver, err = s.CompareAndDelete(ctx, "k", 2); err != nil || ver != 3 {
		t.Fatalf("delete = %d, %v; want version 3", ver, err)
	}
	// A recreated value continues the count, so a reader of version 1 or 2
	// cannot mistake it for what it read.
	if ver, err = s.CompareAndSet(ctx, "k", 3, []byte("back")); err != nil || ver != 4 {
		t.Fatalf("recreate = %d, %v; want version 4", ver, err)
	}
}

// TestFencedWriteChecksVersion checks that SetIfVersion refuses a version it
// did not read without moving the mark, and that fence and version checks
// work together.
func TestFencedWriteChecksVersion(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	v, err := s.FencedGet(ctx, fen(1, "a"), "k")
	if !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.CompareAndSet(ctx, "k", v.Version, []byte("sneaked in")); err != nil {
		t.Fatal(err)
	}
	before := rawState(t, c, s.Prefix()+"k")
	_, err = s.FencedSetIfVersion(ctx, fen(2, "b"), "k", v.Version, []byte("mine"))
	if !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("fenced write at a stale version: %v; want ErrConflict", err)
	}
	if rawState(t, c, s.Prefix()+"k") != before {
		t.Fatal("refused fenced write changed the key (or its mark)")
	}
	if _, err := s.FencedSetIfVersion(ctx, fen(2, "b"), "k", 1, []byte("mine")); err != nil {
		t.Fatalf("fenced write at the right version: %v", err)
	}
	// A stale fence is refused before the version is looked at.
	if _, err := s.FencedSetIfVersion(ctx, fen(1, "a"), "k", 2, []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale fence at the right version: %v; want ErrStale", err)
	}
}

func TestUpdateReportsInterleavedWrite(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	_, err := s.FencedUpdate(ctx, fen(1, "a"), "k", func(old Value) ([]byte, error) {
		// A lock-free writer slips in between the fenced read and write.
		if _, err := s.CompareAndSet(ctx, "k", old.Version, []byte("other")); err != nil {
			t.Fatal(err)
		}
		return []byte("mine"), nil
	})
	if !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("Update over an interleaved write: %v; want ErrConflict", err)
	}
	if v, _ := s.Load(ctx, "k"); string(v.Data) != "other" {
		t.Fatalf("value = %q, want the interleaved write kept", v.Data)
	}
	fnErr := errors.New("no thanks")
	if _, err := s.FencedUpdate(ctx, fen(1, "a"), "k", func(Value) ([]byte, error) { return nil, fnErr }); err != fnErr {
		t.Fatalf("Update returned %v, want fn's error as it is", err)
	}
}

// TestModifyConcurrent runs optimistic increments without any lock; every
// acknowledged one must be in the final value.
func TestModifyConcurrent(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	const workers, each = 8, 25
	var acked, gaveUp atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				_, err := s.Modify(ctx, "n", 50, func(old Value) ([]byte, error) {
					n := 0
					if old.Exists {
						n, _ = strconv.Atoi(string(old.Data))
					}
					return []byte(strconv.Itoa(n + 1)), nil
				})
				switch {
				case err == nil:
					acked.Add(1)
				case errors.Is(err, fence.ErrConflict):
					gaveUp.Add(1)
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	v, err := s.Load(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(string(v.Data)); int64(n) != acked.Load() || v.Version != acked.Load() {
		t.Fatalf("value %d at version %d after %d acknowledged increments", n, v.Version, acked.Load())
	}
	t.Logf("%d acknowledged, %d gave up after 50 attempts", acked.Load(), gaveUp.Load())
}

func TestModifyGivesUp(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	calls := 0
	_, err := s.Modify(ctx, "k", 3, func(old Value) ([]byte, error) {
		calls++
		if _, err := s.CompareAndSet(ctx, "k", old.Version, []byte("interloper")); err != nil {
			t.Fatal(err)
		}
		return []byte("mine"), nil
	})
	if !errors.Is(err, fence.ErrConflict) || calls != 3 {
		t.Fatalf("Modify = %v after %d calls; want ErrConflict after 3", err, calls)
	}
}
