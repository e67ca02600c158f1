package redis

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// replayStore returns a store whose client replays commands when told to,
// with its scripts loaded so that each call is one command.
func replayStore(t *testing.T) (*Store, *testenv.Replay) {
	t.Helper()
	s, c := newStore(t)
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := &testenv.Replay{}
	c.AddHook(h)
	return s, h
}

func TestRetriedVersionedWritesReportTheirSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, h := replayStore(t)

	if _, err := s.CompareAndSet(ctx, "k", 0, []byte("a")); err != nil {
		t.Fatal(err)
	}
	h.Arm(0)
	v, err := s.CompareAndSet(ctx, "k", 1, []byte("b"))
	if err != nil || v != 2 {
		t.Fatalf("retried CompareAndSet = %d, %v; want 2, <nil>", v, err)
	}
	h.Arm(0)
	f := fen(1, "h")
	v, err = s.FencedSetIfVersion(ctx, f, "k", 2, []byte("c"))
	if err != nil || v != 3 {
		t.Fatalf("retried SetIfVersion = %d, %v; want 3, <nil>", v, err)
	}
	h.Arm(0)
	v, err = s.CompareAndDelete(ctx, "k", 3)
	if err != nil || v != 4 {
		t.Fatalf("retried CompareAndDelete = %d, %v; want 4, <nil>", v, err)
	}
	if _, err := s.Load(ctx, "k"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("after the delete: %v", err)
	}

	// A write that really lost the race is still a conflict.
	if _, err := s.CompareAndSet(ctx, "k", 3, []byte("d")); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("stale CompareAndSet = %v, want ErrConflict", err)
	}
	// And a write id is the call's own: another call with the same expected
	// version after a successful write conflicts.
	if _, err := s.CompareAndSet(ctx, "k", 4, []byte("e")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompareAndSet(ctx, "k", 4, []byte("f")); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("second write at the same version = %v, want ErrConflict", err)
	}
}

// A retried write inside Modify or Update must not make them run fn again:
// that would apply the change twice.
func TestRetriedReadModifyWriteAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, h := replayStore(t)
	var calls atomic.Int32
	inc := func(old Value) ([]byte, error) {
		calls.Add(1)
		n, _ := strconv.Atoi(string(old.Data))
		return []byte(strconv.Itoa(n + 1)), nil
	}

	h.Arm(1) // Load passes; the compare-and-set is replayed
	if _, err := s.Modify(ctx, "n", 5, inc); err != nil {
		t.Fatal(err)
	}
	h.Arm(1) // Get passes; the fenced write is replayed
	if _, err := s.FencedUpdate(ctx, fen(1, "h"), "n", inc); err != nil {
		t.Fatal(err)
	}
	v, err := s.Load(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if string(v.Data) != "2" || calls.Load() != 2 {
		t.Fatalf("value %q after %d calls of fn; want \"2\" after 2", v.Data, calls.Load())
	}
}
