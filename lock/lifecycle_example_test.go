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

// AutoRenew keeps a short lease held for as long as the work runs; Done
// closes the moment the lease is lost, and Err says why.
func ExampleAutoRenew() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	// A 10s lease is renewed every ~3.3s until Release: 10s is how long a
	// crashed holder keeps others waiting, not a limit on the work.
	lease, err := locker.Acquire(ctx, "nightly-export", 10*time.Second, lock.AutoRenew())
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)

	for batch := 0; batch < 100; batch++ {
		select {
		case <-lease.Done():
			// Renewal was refused or Redis was unreachable for a whole lease:
			// another holder may have the lock now. Stop; fenced writes made
			// so far are safe, since storage checks the fence.
			fmt.Println("lease lost:", lease.Err(), errors.Is(lease.Err(), lock.ErrNotHeld))
			return
		default:
		}
		_ = lease.Fence() // present it with every read and write of the batch
	}
}

// Do renews its lease while fn runs and cancels fn's context, with the loss
// as its cause, if the lease is lost.
func ExampleLocker_Do_lost() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	entries := []string{"a", "b", "c"}
	err = locker.Do(ctx, "ledger", 5*time.Second, func(ctx context.Context, f fence.Fence) error {
		for range entries {
			if ctx.Err() != nil {
				return context.Cause(ctx) // the lease was lost: matches lock.ErrNotHeld
			}
			// A fenced write of the entry with f, passing ctx, goes here.
		}
		return nil
	})
	switch {
	case errors.Is(err, lock.ErrNotHeld):
		fmt.Println("the lease was lost; the entries written so far were fenced")
	case err != nil:
		panic(err)
	}
}

// Owner makes acquisitions re-entrant for one unit of work: code that
// already holds the lock for a job can take it again without deadlocking
// on itself, and gets the same fence.
func ExampleOwner() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	job := lock.Owner("job-8731")
	outer, err := locker.Acquire(ctx, "account:42", 10*time.Second, job)
	if err != nil {
		panic(err)
	}
	inner, err := locker.TryAcquire(ctx, "account:42", 10*time.Second, job) // at once: one more hold
	if err != nil {
		panic(err)
	}
	fmt.Println(inner.Fence() == outer.Fence())

	_ = inner.Release(ctx) // the lock stays held by outer
	_ = outer.Release(ctx) // the last hold: the lock is free
}
