package lock_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// replyDelay holds about one script reply in three for 20 to 150 ms before
// the Locker sees it, as a slow network or a paused client would: the
// grant or extension already ran on Redis, so the lease started before
// the reply came.
type replyDelay struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (h *replyDelay) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replyDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *replyDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return err
		}
		h.mu.Lock()
		d := time.Duration(0)
		if h.rng.IntN(3) == 0 {
			d = time.Duration(20+h.rng.IntN(131)) * time.Millisecond
		}
		h.mu.Unlock()
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		return err
	}
}

// TestLockModelNeutralSlowReplies is TestLockModelNeutralOnRedis with
// replies held on their way back (replyDelay): every lease's validity must
// count from before its grant or extension was sent, since Redis started
// it when the script ran. A lease counted from its reply is believed for
// as long as the reply was held past the key's end, which the promise
// check sees.
func TestLockModelNeutralSlowReplies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	url := testenv.RedisURL(t)
	prefix := "lmodel:" + fence.NewHolder()[:12] + ":"
	resource := "r"
	watcher := testenv.Redis(t)
	probe, err := lock.New(watcher, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	queue, waiting := queueKeys(probe, resource)
	keys := []string{keysOf(probe).LockKey(resource), keysOf(probe).TokenKey(resource), queue, waiting}
	t.Cleanup(func() { watcher.Del(context.Background(), keys...) })

	b := lockmodel.Backend{
		Name: "redis (slow replies)",
		Locker: func(i int, _ func(string)) (*lock.Locker, error) {
			opt, err := redis.ParseURL(url)
			if err != nil {
				return nil, err
			}
			c := redis.NewClient(opt)
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(&replyDelay{rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))})
			return lock.New(c, lock.WithPrefix(prefix))
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
