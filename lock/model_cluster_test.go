package lock_test

import (
	"context"
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

// The backend-neutral lock model (internal/harness/lockmodel) on a private
// Redis Cluster of three masters with a replica each: every actor's Locker
// on a cluster client of its own, the resource observed in one script on
// whichever master serves its slot. Its faults: the resource's slot moved
// to another master with its keys (twice at most), which loses nothing and
// is excused nothing; and once, the slot's master killed and its replica
// promoted. Replication is asynchronous, so the promoted replica may lack
// the newest grants and releases: the model excuses the promises of grants
// asked for before the kill and the releases answered before it (the lost
// master's alone), and judges every grant and release sent after it, and
// every token, as on one server.

// clusterModelFloors are the cluster run's floors: the single node's,
// without the queue (Redis keeps no log of grants; the Redis model judges
// the queue), and with both faults made and promises judged across each.
func clusterModelFloors() map[string]int {
	floors := lockmodel.DefaultFloors()
	for _, k := range []string{lockmodel.Queue, lockmodel.WaiterAhead, lockmodel.FreeWithWaiter} {
		delete(floors, k)
	}
	floors[lockmodel.Release] = 10
	floors["faults: "+clusterSlotMoved] = 1
	floors["faults: "+clusterFailover] = 1
	floors[lockmodel.FailoverJudged] = 1
	floors[lockmodel.FailoverTokens] = 10
	return floors
}

// clusterLongTTL is the lease of one try or wait in clusterLongEvery: long
// enough to outlast a failover, so that the promoted replica is judged
// against a promise the lost master made.
const (
	clusterLongTTL   = 5 * time.Second
	clusterLongEvery = 8
)

const (
	clusterSlotMoved = "slot moved"
	clusterFailover  = "master failover"
)

// clusterModel is one cluster and what the model's runs on it share.
type clusterModel struct {
	cl       *testenv.Cluster
	prefix   string
	resource string
	keys     []string // lock, token state, queue, waiter entries
}

func newClusterModel(t *testing.T) *clusterModel {
	cm := &clusterModel{cl: testenv.StartCluster(t, 3, 1), prefix: "lmcluster:" + fence.NewHolder()[:12] + ":", resource: "r"}
	probe, err := lock.New(cm.cl.Client(), lock.WithPrefix(cm.prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	queue, waiting := queueKeys(probe, cm.resource)
	cm.keys = []string{keysOf(probe).LockKey(cm.resource), keysOf(probe).TokenKey(cm.resource), queue, waiting}
	return cm
}

// backend is the model's backend on the cluster; hooks, if any, are added
// to every actor's client (a broken variant).
func (cm *clusterModel) backend(t testing.TB, faults bool, hooks ...redis.Hook) lockmodel.Backend {
	watcher := cm.cl.Client()
	var clients []*redis.ClusterClient
	b := lockmodel.Backend{
		Name: "redis-cluster",
		Locker: func(int, func(string)) (*lock.Locker, error) {
			c := cm.cl.Client()
			clients = append(clients, c)
			for _, h := range hooks {
				c.AddHook(h)
			}
			return lock.New(c, lock.WithPrefix(cm.prefix))
		},
		Close: func() {
			// The actors' clients; the watcher serves every run of a
			// control, and the test closes it.
			for _, c := range clients {
				_ = c.Close()
			}
			clients = nil
		},
		Observe: func(ctx context.Context, _ string) (lockmodel.Observation, error) {
			return lockmodel.ObserveRedis(ctx, watcher, cm.keys)
		},
	}
	if faults {
		b.Faults = []lockmodel.Fault{
			{Name: clusterSlotMoved, Limit: 2, Inject: func(ctx context.Context) error {
				_, _, err := cm.cl.MoveSlot(ctx, cm.keys[0])
				return err
			}},
			{Name: clusterFailover, Limit: 1, Fail: func(ctx context.Context, lost func()) error {
				// Once a long lease holds the lock with most of it left
				// (or after 10 s), so that a promise made by the lost
				// master is judged on the promoted replica.
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(5 * time.Millisecond) {
					if d, err := watcher.PTTL(ctx, cm.keys[0]).Result(); err == nil && d > clusterLongTTL*3/5 {
						break
					}
				}
				left, _ := watcher.PTTL(ctx, cm.keys[0]).Result()
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				began := time.Now()
				_, err := cm.cl.Failover(ctx, cm.keys[0], lost)
				t.Logf("failover: the lock had %v left at the kill; another master served it %v after", left, time.Since(began).Round(time.Millisecond))
				return err
			}},
		}
	}
	return b
}

// TestLockModelCluster runs the model on the cluster with its faults:
// twice the budget, since a failover takes a second or two.
func TestLockModelCluster(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cm := newClusterModel(t)
	floors := clusterModelFloors()
	r := lockmodel.Run(t, cm.backend(t, true), lockmodel.Config{Resource: cm.resource, Budget: 2 * lockmodel.Budget(t), Faults: true, Floors: floors, Label: "faults",
		LongTTL: clusterLongTTL, LongEvery: clusterLongEvery})
	r.Report(t)
	r.Check(t, floors)
}

// TestLockModelClusterControls runs the Redis runs' broken variants that
// the neutral model can see on the cluster, each with three seeds, on a
// cluster without faults: a release without its holder check (the Redis
// model's variant), grants that reuse the last token, and leases the
// server holds for less than the Locker was told.
func TestLockModelClusterControls(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cm := newClusterModel(t)
	release := releaseWithoutHolderCheckSource(t)
	var reuse []redis.Hook
	for _, name := range []string{"acquire", "try", "release"} {
		src := breakScript(t, name, "local t = math.max(n + 1, now)", "local t = math.max(n, now - 1000000)")
		reuse = append(reuse, swapHook{name: name, src: src, exposed: func(*model, scriptCall, *redis.Cmd, time.Time) {}})
	}
	cs := []lockmodel.Control{
		{Name: "release without the holder check", CaughtBy: []string{lockmodel.Promise, lockmodel.Release},
			Install: func(t testing.TB) (lockmodel.Backend, func()) {
				return cm.backend(t, false, swapHook{name: "release", src: release, exposed: func(_ *model, _ scriptCall, c *redis.Cmd, _ time.Time) {
					if n, ok := c.Val().(int64); ok && n == 7 {
						c.SetVal(int64(1)) // freed another holder's lock: answer as a release does
					}
				}}), func() {}
			}},
		{Name: "token not raised", CaughtBy: []string{lockmodel.Tokens, lockmodel.Anchor},
			Install: func(t testing.TB) (lockmodel.Backend, func()) { return cm.backend(t, false, reuse...), func() {} }},
		{Name: "lease shorter on the server", CaughtBy: []string{lockmodel.Promise},
			Install: func(t testing.TB) (lockmodel.Backend, func()) {
				return cm.backend(t, false, shortLeaseHook{cut: 30 * time.Millisecond}), func() {}
			}},
	}
	lockmodel.RunControls(t, cs, lockmodel.Budget(t)/lockmodel.ControlRuns, lockmodel.Config{Resource: cm.resource})
}

// shortLeaseHook is a broken Locker whose grants (acquire.lua, try.lua;
// a hand-over takes the lease its waiter queued with) ask the server for
// cut less than the lease the Locker counts its validity from.
type shortLeaseHook struct{ cut time.Duration }

func (shortLeaseHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (shortLeaseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h shortLeaseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		call, ok := parseScriptCall(cmd.Args())
		if ok && (call.name == "acquire" || call.name == "try") && len(call.argv) >= 2 {
			args := cmd.Args()
			// ARGV[2], the lease in ms, after the script, the key count
			// and the keys.
			i := 3 + len(call.keys) + 1
			if ms, err := strconv.ParseInt(strings.TrimSpace(argText(args[i])), 10, 64); err == nil {
				args[i] = strconv.FormatInt(max(ms-h.cut.Milliseconds(), 1), 10)
			}
		}
		return next(ctx, cmd)
	}
}
