package rueidisfence

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
)

// The lock model (internal/harness/lockmodel) on the rueidis client: the
// actors' Lockers talk to the shared Redis through rueidis, the watcher
// reads the resource's keys through go-redis in one script, on the
// server's clock. Redis keeps no log of its grants, so the queue's order
// is judged by the Redis model of package lock, which runs the same
// scripts; here the model judges what the rueidis client could get wrong:
// the replies it reads (tokens, lease lengths, grants and hand-overs) and
// the wake-ups it delivers.

// modelRedis is the model's backend on rueidis: tune, if set, changes each
// actor's client (a control's broken adapter).
type modelRedis struct {
	t       *testing.T
	prefix  string
	watcher *redis.Client
	keys    []string
	tune    func(*client)
}

func newModelRedis(t *testing.T, resource string) *modelRedis {
	m := &modelRedis{t: t, prefix: "rfmodel:" + fence.NewHolder()[:12] + ":", watcher: testenv.Redis(t)}
	base := m.prefix + "{" + resource + "}"
	m.keys = []string{base + ":lock", base + ":token", base + ":queue", base + ":waiting"}
	t.Cleanup(func() { m.watcher.Del(context.Background(), m.keys...) })
	return m
}

func (m *modelRedis) backend() lockmodel.Backend {
	scripts := redisbackend.ModelScripts()
	return lockmodel.Backend{
		Name: "rueidis",
		Locker: func(_ int, seen func(string)) (*lock.Locker, error) {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.watcher.Options().Addr}, DisableCache: true})
			if err != nil {
				return nil, err
			}
			m.t.Cleanup(rc.Close)
			c := newClient(rc)
			c.before = func(hash string, _, args []string) {
				if s := scripts[hash]; (s == "try" || s == "acquire") && len(args) > 0 {
					seen(args[0])
				}
			}
			if m.tune != nil {
				m.tune(c)
			}
			return newOn(c, []lock.Option{lock.WithPrefix(m.prefix)})
		},
		Observe: func(ctx context.Context, _ string) (lockmodel.Observation, error) {
			return lockmodel.ObserveRedis(ctx, m.watcher, m.keys)
		},
	}
}

// modelFloors are the model's floors here: the queue is not judged (no
// grant log), and neither are the states only the queue check needs.
func modelFloors() map[string]int {
	f := lockmodel.DefaultFloors()
	for _, k := range []string{lockmodel.Queue, lockmodel.WaiterAhead, lockmodel.FreeWithWaiter} {
		delete(f, k)
	}
	return f
}

// TestLockModel runs the lock model on Lockers of the rueidis client and
// judges every check with its floor.
func TestLockModel(t *testing.T) {
	const resource = "r"
	m := newModelRedis(t, resource)
	floors := modelFloors()
	r := lockmodel.Run(t, m.backend(), lockmodel.Config{Resource: resource, Floors: floors})
	r.Report(t)
	r.Check(t, floors)
}

// TestLockModelControls runs the model on two broken rueidis adapters,
// each of which must be rejected in most of its runs: one that misreads a
// grant's token (a thousandth of it: still increasing from one
// millisecond to the next, but far below the server's clock and unlike
// the token the server holds for the grant), caught by the anchor, token
// or promise checks; and one that misreads every lease length
// (a hand-over's remaining time, an extension's) as ten times what Redis
// said, caught by the promise check.
func TestLockModelControls(t *testing.T) {
	const resource = "r"
	tokens := newModelRedis(t, resource)
	tokens.tune = func(c *client) { c.reply = misreadTokens }
	leases := newModelRedis(t, resource)
	leases.tune = func(c *client) { c.reply = misreadLeases }
	cs := []lockmodel.Control{{
		Name:     "tokens misread",
		CaughtBy: []string{lockmodel.Anchor, lockmodel.Tokens, lockmodel.Promise},
		Install:  func(testing.TB) (lockmodel.Backend, func()) { return tokens.backend(), func() {} },
	}, {
		Name:     "lease lengths misread",
		CaughtBy: []string{lockmodel.Promise},
		Install:  func(testing.TB) (lockmodel.Backend, func()) { return leases.backend(), func() {} },
	}}
	lockmodel.RunControls(t, cs, lockmodel.Budget(t), lockmodel.Config{Resource: resource})
}

// tokenLike is the least number read as a token: the server's clock in
// µs is far above it.
const tokenLike = 1_000_000_000_000

// misreadTokens reads a reply, then takes every token in it (a number or
// numeric text above tokenLike, at the top or in an array) as a
// thousandth of itself.
func misreadTokens(res rueidis.RedisResult) redisbackend.Reply {
	r := newReply(res)
	cut := func(v any) any {
		switch v := v.(type) {
		case int64:
			if v > tokenLike {
				return v / 1000
			}
		case string:
			digits, rest, _ := strings.Cut(v, " ")
			if n, err := strconv.ParseInt(digits, 10, 64); err == nil && n > tokenLike {
				if rest != "" {
					return strconv.FormatInt(n/1000, 10) + " " + rest
				}
				return strconv.FormatInt(n/1000, 10)
			}
		}
		return v
	}
	if arr, ok := r.val.([]any); ok {
		for i := range arr {
			arr[i] = cut(arr[i])
		}
	} else {
		r.val = cut(r.val)
	}
	return r
}

// misreadLeases reads a reply, then takes a hand-over's remaining time
// ({3, token, ms}) and a lone positive number below tokenLike (an
// extension's or a TTL's milliseconds) as ten times what they are.
func misreadLeases(res rueidis.RedisResult) redisbackend.Reply {
	r := newReply(res)
	switch v := r.val.(type) {
	case int64:
		if v > 0 && v < tokenLike {
			r.val = v * 10
		}
	case []any:
		if len(v) == 3 {
			if k, ok := v[0].(int64); ok && k == 3 {
				if ms, ok := v[2].(int64); ok && ms > 0 {
					v[2] = ms * 10
				}
			}
		}
	}
	return r
}
