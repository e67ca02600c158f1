package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestLeaseLeavesNoGoroutines takes a lease through every path of its life
// (acquire, extend, release; Do; a refused TryAcquire) and checks that once
// the client is closed no goroutine started by them is left running.
func TestLeaseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)

	lease, err := l.Acquire(ctx, "leak", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "leak", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held resource = %v, want ErrNotAcquired", err)
	}
	if err := lease.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Do(ctx, "leak", 5*time.Second, func(context.Context, fence.Fence) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
