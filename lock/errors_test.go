package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestErrInvalidMatchesFence: lock's invalid-argument errors match
// fence.ErrInvalid too, so one errors.Is works whichever package refused
// the argument, and say that lock refused it.
func TestErrInvalidMatchesFence(t *testing.T) {
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.TryAcquire(context.Background(), "", time.Second)
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("TryAcquire with an empty resource: %v; want fence.ErrInvalid", err)
	}
	if !strings.HasPrefix(err.Error(), "lock: invalid argument") {
		t.Fatalf("TryAcquire with an empty resource says %q; want lock's own message", err)
	}
	if _, err := lock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(nil): %v; want fence.ErrInvalid", err)
	}
}
