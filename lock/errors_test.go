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
	"github.com/redis/go-redis/v9"
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

// TestErrUnsupported: what a backend does not offer is refused with the
// one exported sentinel, which matches the standard library's and
// fence.ErrInvalid, before anything is sent; and the Redis names are had
// only where they mean something.
func TestErrUnsupported(t *testing.T) {
	client := testenv.Redis(t)
	if _, err := lock.New(client, lock.WithNodeTimeout(time.Second)); !errors.Is(err, lock.ErrUnsupported) ||
		!errors.Is(err, errors.ErrUnsupported) || !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New with WithNodeTimeout = %v, want lock.ErrUnsupported, errors.ErrUnsupported and fence.ErrInvalid", err)
	}
	rl, err := lock.NewRedlock([]redis.UniversalClient{client}, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rl.TryAcquire(ctx, "r", time.Second, lock.Owner("o")); !errors.Is(err, lock.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Redlock TryAcquire with an Owner = %v, want lock.ErrUnsupported", err)
	}
	if _, err := rl.FenceLock(ctx, "legacy:lock", "v"); !errors.Is(err, lock.ErrUnsupported) {
		t.Fatalf("Redlock FenceLock = %v, want lock.ErrUnsupported", err)
	}
	var names lock.RedisNames
	if !rl.As(&names) || names.Quorum() != 1 {
		t.Fatalf("Redlock As(*RedisNames) = false or quorum %d, want true and 1", names.Quorum())
	}
	if _, err := names.FenceKey("legacy:lock"); !errors.Is(err, lock.ErrUnsupported) {
		t.Fatalf("Redlock FenceKey = %v, want lock.ErrUnsupported", err)
	}
	var other struct{}
	if rl.As(&other) {
		t.Fatal("As of an unknown target = true")
	}
}
