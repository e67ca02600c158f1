package lock_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// Fence a lock that another library took. Such libraries (redsync,
// bsm/redislock) take their lock with SET key value NX PX and a random value;
// the plain SET below stands in for them. For redsync pass mutex.Name() and
// mutex.Value(); for redislock lk.Key() and its lock value,
// lk.Token()+lk.Metadata(), which redislock calls a token but which is only
// a random value (go run ./examples/migrate shows both).
func ExampleLocker_FenceLock() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	key, value := "report", rand.Text() // the other library's lock key and random value
	if ok, err := client.SetNX(ctx, key, value, 10*time.Second).Result(); err != nil || !ok {
		panic("the report is locked by someone else")
	}
	defer client.Del(ctx, key) // the other library's release

	f, err := locker.FenceLock(ctx, key, value)
	if errors.Is(err, lock.ErrNotHeld) {
		fmt.Println("the lock expired before it was fenced")
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println(f.Resource, f.Token > 0) // present f with every read and write made under the lock
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
	key, value := "invoice:42", rand.Text() // a lock another library holds
	if ok, err := client.SetNX(ctx, key, value, 10*time.Second).Result(); err != nil || !ok {
		panic("the invoice is locked by someone else")
	}
	defer client.Del(ctx, key)

	var writeErr error // the error of a fenced write, for example *fence.StaleError
	if hwm, ok := fence.LostTo(writeErr); ok {
		f, err := locker.FenceLockAbove(ctx, key, value, hwm.Token)
		if err != nil {
			panic(err) // ErrNotHeld: another holder has the lock; the refusal stands
		}
		fmt.Println("retry the write with token", f.Token)
	}
}
