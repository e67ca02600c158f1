package lock_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

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
			return lockmodel.ObserveRedis(ctx, watcher, keys)
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
