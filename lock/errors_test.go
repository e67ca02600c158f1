package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestErrInvalidMatchesFence: lock's invalid-argument errors match
// fence.ErrInvalid too, so one errors.Is works whichever package refused
// the argument; fence's own do not match lock.ErrInvalid.
func TestErrInvalidMatchesFence(t *testing.T) {
	if !errors.Is(lock.ErrInvalid, fence.ErrInvalid) {
		t.Fatal("lock.ErrInvalid does not match fence.ErrInvalid")
	}
	if errors.Is(fence.ErrInvalid, lock.ErrInvalid) || errors.Is(fence.ErrInvalidFence, lock.ErrInvalid) {
		t.Fatal("fence's invalid-argument errors match lock.ErrInvalid")
	}
	if got := lock.ErrInvalid.Error(); got != "lock: invalid argument" {
		t.Fatalf("lock.ErrInvalid says %q", got)
	}
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.TryAcquire(context.Background(), "", time.Second)
	if !errors.Is(err, lock.ErrInvalid) || !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("TryAcquire with an empty resource: %v; want lock.ErrInvalid and fence.ErrInvalid", err)
	}
	if _, err := lock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(nil): %v; want fence.ErrInvalid", err)
	}
}
