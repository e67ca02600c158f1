package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// Keep a redsync mutex and fence its grant: present f with every read and
// write made under the mutex.
func ExampleLocker_FenceLock_redsync() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	mutex := redsync.New(rsgoredis.NewPool(client)).NewMutex("report", redsync.WithExpiry(10*time.Second))
	if err := mutex.LockContext(ctx); err != nil {
		panic(err)
	}
	defer mutex.UnlockContext(ctx)

	f, err := locker.FenceLock(ctx, mutex.Name(), mutex.Value())
	if errors.Is(err, lock.ErrNotHeld) {
		fmt.Println("the mutex expired before it was fenced")
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println(f.Resource, f.Token > 0)
}

// Keep a bsm/redislock lock and fence its grant. redislock stores the token
// followed by the metadata, so both make up the value.
func ExampleLocker_FenceLock_redislock() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	lk, err := redislock.Obtain(ctx, client, "invoice:42", 10*time.Second, nil)
	if err != nil {
		panic(err)
	}
	defer lk.Release(ctx)

	f, err := locker.FenceLock(ctx, lk.Key(), lk.Token()+lk.Metadata())
	if err != nil {
		panic(err)
	}
	fmt.Println(f.Resource, f.Token > 0)
}

// After Redis lost the fence records, a store refuses the grant's low token;
// FenceLockAbove issues the grant a token above the store's mark.
func ExampleLocker_FenceLockAbove() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	lk, err := redislock.Obtain(ctx, client, "invoice:42", 10*time.Second, nil)
	if err != nil {
		panic(err)
	}
	defer lk.Release(ctx)

	var writeErr error // the error of a fenced write, for example *fence.StaleError
	if hwm, ok := fence.HighWater(writeErr); ok {
		f, err := locker.FenceLockAbove(ctx, lk.Key(), lk.Token(), hwm.Token)
		if err != nil {
			panic(err) // ErrNotHeld: another holder has the lock; the refusal stands
		}
		fmt.Println("retry the write with token", f.Token)
	}
}
