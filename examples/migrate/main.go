// Command migrate shows code that locks with redsync or bsm/redislock before
// and after it adds fencing, without replacing its lock: after taking the
// lock, ask [lock.Locker.FenceLock] for the grant's fence and present it with
// every read and write to a fenced store. It ends with the case fencing is
// for: a holder that pauses past its lease has its late write refused.
//
// Usage:
//
//	go run ./examples/migrate [-redis 127.0.0.1:6379]
//
// Each run writes keys under "fencekit:example:migrate:<run>:" only, and
// deletes them when it ends, so every run starts its counts from zero. It
// exits with status 2 when Redis is unreachable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/examples/internal/cli"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// prefix puts every key the example writes under one name, one per run;
// tests change it.
var prefix = "fencekit:example:migrate:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"

// cleanup deletes the run's keys; set once Redis is reachable.
var cleanup = func() {}

func main() {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	addr := fs.String("redis", "127.0.0.1:6379", "Redis address (host:port)")
	if done, code := cli.Parse(fs, "migrate", "redsync and redislock code before and after it adds fencing, and a paused holder's late write refused", os.Args[1:]); done {
		os.Exit(code)
	}
	ctx := context.Background()

	if conn, err := net.DialTimeout("tcp", *addr, 2*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "migrate: cannot reach Redis at %s: %v\nstart Redis there or pass -redis host:port\n", *addr, err)
		os.Exit(2)
	} else {
		conn.Close()
	}
	client := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	defer client.Close()
	cleanup = func() { deleteRun(client) }
	defer cleanup()

	// Added by the migration: a Locker for tokens, a store that checks them.
	locker, err := lock.New(client, lock.WithPrefix(prefix))
	if err != nil {
		fail(err)
	}
	store, err := fkredis.New(client, fkredis.WithPrefix(prefix+"data:"))
	if err != nil {
		fail(err)
	}
	rs := redsync.New(rsgoredis.NewPool(client))
	rl := redislock.New(client)

	run("redsync, before", func() error { return redsyncBefore(ctx, rs, client) })
	run("redsync, after", func() error { return redsyncAfter(ctx, rs, locker, store) })
	run("redislock, before", func() error { return redislockBefore(ctx, rl, client) })
	run("redislock, after", func() error { return redislockAfter(ctx, rl, locker, store) })
	run("a holder paused past its lease, after", func() error { return pausedHolder(ctx, rl, locker, store) })
}

// redsyncBefore: lock, read, write, unlock. A holder paused past its lease
// still writes, over the next holder's work.
func redsyncBefore(ctx context.Context, rs *redsync.Redsync, client *redis.Client) error {
	mutex := rs.NewMutex(prefix+"redsync-lock", redsync.WithExpiry(10*time.Second))
	if err := mutex.LockContext(ctx); err != nil {
		return err
	}
	defer mutex.UnlockContext(ctx)

	return plainIncrement(ctx, client, "redsync-unfenced-count")
}

// redsyncAfter: the same lock, plus FenceLock and a fenced read and write.
func redsyncAfter(ctx context.Context, rs *redsync.Redsync, locker *lock.Locker, store *fkredis.Store) error {
	mutex := rs.NewMutex(prefix+"redsync-lock", redsync.WithExpiry(10*time.Second))
	if err := mutex.LockContext(ctx); err != nil {
		return err
	}
	defer mutex.UnlockContext(ctx)

	f, err := locker.FenceLock(ctx, mutex.Name(), mutex.Value())
	if err != nil {
		return err
	}
	return increment(ctx, store, f, "redsync-fenced-count")
}

// redislockBefore: lock, read, write, release.
func redislockBefore(ctx context.Context, rl *redislock.Client, client *redis.Client) error {
	lk, err := rl.Obtain(ctx, prefix+"redislock-lock", 10*time.Second, nil)
	if err != nil {
		return err
	}
	defer lk.Release(ctx)

	return plainIncrement(ctx, client, "redislock-unfenced-count")
}

// redislockAfter: the same lock, plus FenceLock and a fenced read and write.
// redislock's lock value is its random "token" (not a fencing token) followed
// by its metadata.
func redislockAfter(ctx context.Context, rl *redislock.Client, locker *lock.Locker, store *fkredis.Store) error {
	lk, err := rl.Obtain(ctx, prefix+"redislock-lock", 10*time.Second, nil)
	if err != nil {
		return err
	}
	defer lk.Release(ctx)

	f, err := locker.FenceLock(ctx, lk.Key(), lk.Token()+lk.Metadata())
	if err != nil {
		return err
	}
	return increment(ctx, store, f, "redislock-fenced-count")
}

// plainIncrement is a read, then a write of the read value plus one, with
// nothing to refuse a holder whose lease has run out.
func plainIncrement(ctx context.Context, client *redis.Client, key string) error {
	n, err := client.Get(ctx, prefix+"plain:"+key).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if err := client.Set(ctx, prefix+"plain:"+key, n+1, 0).Err(); err != nil {
		return err
	}
	fmt.Printf("  %s = %d: a plain GET and SET, which nothing stops after the lease ends\n", key, n+1)
	return nil
}

// increment is a fenced read, then a fenced write of the read value plus
// one. Both must be fenced: the read keeps an older holder from writing
// between them.
func increment(ctx context.Context, store *fkredis.Store, f fence.Fence, key string) error {
	v, err := store.FencedGet(ctx, f, key)
	if err != nil && !errors.Is(err, fence.ErrNotFound) {
		return err
	}
	n, _ := strconv.Atoi(string(v.Data)) // a missing value counts as 0
	_, err = store.FencedSet(ctx, f, key, []byte(strconv.Itoa(n+1)))
	if err == nil {
		fmt.Printf("  %s = %d: a fenced Get and Set with token %d, refused once a newer holder is admitted\n", key, n+1, f.Token)
	}
	return err
}

// pausedHolder: A is fenced, then pauses past its 100ms lease; B takes the
// lock and increments; A's late write is refused as stale.
func pausedHolder(ctx context.Context, rl *redislock.Client, locker *lock.Locker, store *fkredis.Store) error {
	key := prefix + "paused-lock"
	a, err := rl.Obtain(ctx, key, 100*time.Millisecond, nil)
	if err != nil {
		return err
	}
	fa, err := locker.FenceLock(ctx, a.Key(), a.Token())
	if err != nil {
		return err
	}
	if _, err := store.FencedGet(ctx, fa, "paused-count"); err != nil && !errors.Is(err, fence.ErrNotFound) {
		return err
	}
	time.Sleep(200 * time.Millisecond) // A pauses: a GC pause, a slow network

	b, err := rl.Obtain(ctx, key, 10*time.Second, nil)
	if err != nil {
		return err
	}
	fb, err := locker.FenceLock(ctx, b.Key(), b.Token())
	if err != nil {
		return err
	}
	if err := increment(ctx, store, fb, "paused-count"); err != nil {
		return err
	}
	_ = b.Release(ctx)

	_, err = store.FencedSet(ctx, fa, "paused-count", []byte("stale"))
	if !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("the paused holder's write was not refused: %v", err)
	}
	fmt.Printf("  holder A (token %d) paused past its lease, holder B (token %d) incremented; A's late write is refused:\n    %v\n", fa.Token, fb.Token, err)
	return nil
}

func run(name string, step func() error) {
	fmt.Println(name)
	if err := step(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "migrate:", err)
	cleanup()
	os.Exit(1)
}

// deleteRun deletes every key this run wrote.
func deleteRun(client *redis.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		client.Del(ctx, iter.Val())
	}
}
