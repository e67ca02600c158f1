package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/storage/redis"
)

// Increment a counter under a lock: the fenced read and write refuse a
// holder whose lease expired while a newer holder got in.
func ExampleStore_FencedUpdate() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}
	store, err := redis.New(client)
	if err != nil {
		panic(err)
	}
	err = locker.Do(ctx, "counter:visits", 5*time.Second, func(ctx context.Context, f fence.Fence) error {
		_, err := store.FencedUpdate(ctx, f, "counter:visits", func(old redis.Value) ([]byte, error) {
			n, _ := strconv.Atoi(string(old.Data)) // a missing value counts as 0
			return strconv.AppendInt(nil, int64(n+1), 10), nil
		})
		return err
	})
	switch {
	case errors.Is(err, fence.ErrStale):
		hw, _ := fence.LostTo(err)
		fmt.Println("a newer holder got in first, with token", hw.Token)
	case err != nil:
		panic(err) // Redis unreachable, or the outcome is unknown (fence.ErrOutcomeUnknown)
	}
}

// Write under a fence and read back; an older fence is refused with the
// mark it lost to.
func ExampleStore_FencedSet() {
	ctx := context.Background()
	store, err := redis.New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"}),
		redis.WithPrefix("app:data:"))
	if err != nil {
		panic(err)
	}
	newer := fence.Fence{Resource: "profile:7", Token: 8, Holder: fence.NewHolder()}
	older := fence.Fence{Resource: "profile:7", Token: 7, Holder: fence.NewHolder()}

	if _, err := store.FencedSet(ctx, newer, "profile:7", []byte(`{"name":"Ada"}`), redis.WithTTL(time.Hour)); err != nil {
		panic(err)
	}
	_, err = store.FencedSet(ctx, older, "profile:7", []byte(`{"name":"stale"}`))
	switch {
	case errors.Is(err, fence.ErrStale):
		fmt.Println("refused: a newer fence was admitted")
	case err != nil:
		panic(err)
	}
}

// Optimistic read-modify-write with no lock at all: retried on a version
// conflict, at most five times.
func ExampleStore_Modify() {
	ctx := context.Background()
	store, err := redis.New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	v, err := store.Modify(ctx, "greeting", 5, func(old redis.Value) ([]byte, error) {
		if !old.Exists {
			return []byte("hello"), nil
		}
		return append(old.Data, '!'), nil
	})
	switch {
	case errors.Is(err, fence.ErrConflict):
		fmt.Println("too busy, try later")
		return
	case err != nil:
		panic(err)
	}
	fmt.Println(string(v.Data), v.Version)
}

// Compare-and-set on the version read; a concurrent writer makes it fail
// with the version it found.
func ExampleStore_CompareAndSet() {
	ctx := context.Background()
	store, err := redis.New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	cur, err := store.Load(ctx, "settings")
	if err != nil && !errors.Is(err, fence.ErrNotFound) {
		panic(err)
	}
	_, err = store.CompareAndSet(ctx, "settings", cur.Version, []byte("dark-mode=on"))
	var ce *fence.ConflictError
	switch {
	case errors.As(err, &ce):
		fmt.Println("someone else wrote version", ce.Actual)
	case err != nil:
		panic(err)
	}
}
