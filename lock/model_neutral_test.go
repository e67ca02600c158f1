package lock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// neutralObserveScript reads a resource's lock in one script, on the
// server's clock: the lock key's holder, the token state, the queue in
// order with each waiter's entry, and the clock.
var neutralObserveScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local s = redis.call('GET', KEYS[2])
local q = redis.call('ZRANGE', KEYS[3], 0, -1)
local e = {}
if #q > 0 then
  e = redis.call('HMGET', KEYS[4], unpack(q))
end
local t = redis.call('TIME')
return {v, s, q, e, t[1], t[2]}`)

// TestLockModelNeutralOnRedis runs the backend-neutral lock model
// (internal/harness/lockmodel), which PostgreSQL and etcd run too, on
// Redis once, beside the Redis model above, to show the two agree there.
// Redis keeps no log of its grants, so the queue's order is judged by the
// Redis model only.
func TestLockModelNeutralOnRedis(t *testing.T) {
	testenv.Slow(t)
	url := testenv.RedisURL(t)
	prefix := "lmodel:" + fence.NewHolder()[:12] + ":"
	resource := "r"
	watcher := testenv.Redis(t)
	var keys []string
	newClient := func() *redis.Client {
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	probe, err := lock.New(watcher, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	queue, waiting := queueKeys(probe, resource)
	keys = []string{keysOf(probe).LockKey(resource), keysOf(probe).TokenKey(resource), queue, waiting}
	t.Cleanup(func() { watcher.Del(context.Background(), keys...) })

	b := lockmodel.Backend{
		Name: "redis",
		Locker: func(int, func(string)) (*lock.Locker, error) {
			return lock.New(newClient(), lock.WithPrefix(prefix))
		},
		Observe: func(ctx context.Context, _ string) (lockmodel.Observation, error) {
			return observeNeutral(ctx, watcher, keys)
		},
	}
	floors := lockmodel.DefaultFloors()
	for _, k := range []string{lockmodel.Queue, lockmodel.WaiterAhead, lockmodel.FreeWithWaiter} {
		delete(floors, k)
	}
	r := lockmodel.Run(t, b, lockmodel.Config{Resource: resource, Floors: floors})
	r.Report(t)
	r.Check(t, floors)
}

// observeNeutral reads the lock at keys (lock, token state, queue, waiter
// entries) in one script. The token is the grant's in the token state,
// "<n> <h>" or "<n> <g> <h>", when its holder mark is the lock holder's;
// the floor is the server's clock in µs less one, below every later
// token (max(n+1, clock)).
func observeNeutral(ctx context.Context, c redis.Scripter, keys []string) (lockmodel.Observation, error) {
	var o lockmodel.Observation
	raw, err := neutralObserveScript.Run(ctx, c, keys).Slice()
	if err != nil {
		return o, err
	}
	if len(raw) != 6 {
		return o, fmt.Errorf("observe: %d values", len(raw))
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(raw[4]), 10, 64)
	usec, _ := strconv.ParseInt(fmt.Sprint(raw[5]), 10, 64)
	now := sec*1_000_000 + usec
	o.Floor = fence.Token(now - 1)
	if v, ok := raw[0].(string); ok {
		o.Holder = v
		if s, ok := raw[1].(string); ok {
			f := strings.Fields(s)
			var g, h string
			switch len(f) {
			case 2:
				g, h = f[0], f[1]
			case 3:
				g, h = f[1], f[2]
			}
			if h != "" && strings.HasPrefix(v, h) {
				n, _ := strconv.ParseInt(g, 10, 64)
				o.Token = fence.Token(n)
			}
		}
	}
	q, _ := raw[2].([]any)
	e, _ := raw[3].([]any)
	for i, w := range q {
		holder, _ := w.(string)
		life := time.Duration(-1)
		if i < len(e) {
			// "<refreshed µs> <life ms> <lease ms> <owner>"
			if s, ok := e[i].(string); ok {
				if f := strings.Fields(s); len(f) >= 2 {
					ref, _ := strconv.ParseInt(f[0], 10, 64)
					ms, _ := strconv.ParseInt(f[1], 10, 64)
					life = time.Duration(ref+ms*1000-now) * time.Microsecond
				}
			}
		}
		o.Waiters = append(o.Waiters, lockmodel.Waiter{Holder: holder, Life: life})
	}
	return o, nil
}
