package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// Acquire a lease, hand its fence to storage with every write, release it.
func ExampleLocker_Acquire() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	lease, err := locker.Acquire(ctx, "invoice:42", 10*time.Second)
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)

	f := lease.Fence() // present f with every read and write made under the lease
	fmt.Println(f.Resource, f.Token > 0)
}

// Do wraps acquire, run and release; fn gets the fence to present to storage.
func ExampleLocker_Do() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	err = locker.Do(ctx, "nightly-report", 30*time.Second, func(ctx context.Context, f fence.Fence) error {
		// A fenced write through storage/postgres or storage/redis goes here.
		fmt.Println("token", f.Token)
		return nil
	})
	switch {
	case errors.Is(err, lock.ErrNotHeld):
		fmt.Println("the lease expired before the work finished")
	case err != nil:
		panic(err) // not acquired in time, Redis unreachable, or the work's own error
	}
}

// TryAcquire does not wait: when the resource is held it says for how long.
func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	lease, err := locker.TryAcquire(ctx, "cache-rebuild", 5*time.Second)
	var busy *lock.NotAcquiredError
	switch {
	case errors.As(err, &busy):
		fmt.Println("held by another holder for", busy.Remaining)
	case err != nil:
		panic(err)
	default:
		defer lease.Release(ctx)
		fmt.Println("got token", lease.Fence().Token)
	}
}

// After a stale refusal, the safe next step is to drop the work or to redo
// the whole unit of work, from its fenced read, under a new grant. Never retry
// only the refused write: its value was computed from a read that a newer
// holder may have overtaken. Lost token state heals by itself (tokens follow
// the server's clock); Advance moves the counter past a store's mark when
// that clock went back.
func ExampleLocker_Advance() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	var writeErr error // the error of a fenced write, for example *fence.StaleError
	if hwm, ok := fence.LostTo(writeErr); ok {
		if err := locker.Advance(ctx, hwm.Resource, hwm.Token); err != nil {
			panic(err)
		}
		// Then start over: acquire, fenced read, compute, fenced write.
	}
}
