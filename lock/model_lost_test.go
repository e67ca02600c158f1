package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The lost-reply scenario: requests and replies lost in the network on
// their way to and from Redis, and a liveness judgment with a bound. A
// grant that nobody alive holds (its caller's Release could not tell
// whether it landed, or its caller's try lost its reply and gave up) must
// not stand longer than lostBound after that caller was done, well under
// the lease's lostTTL: the Locker cleans up in the background what it
// could not clean up within the call.
//
// Its Locker has a client of its own, through a proxy, that does not
// retry (MaxRetries -1), so that a lost reply reaches the Locker rather
// than being retried by go-redis (which a lost request would outlast:
// the client waits its read timeout for it). The rounds alternate
// between:
//
//   - a release lost: a lease of lostTTL is released with a deadline of
//     lostReleaseWait while the proxy drops the release's request (it
//     never reaches Redis); the Release ends at its deadline, not knowing
//     whether the release landed, and the Locker must release again in
//     the background; in one round of two the deadline is past the
//     client's read timeout, so that the call fails on a live context
//     (a client that does not retry, a connection reset), which must be
//     released again all the same;
//   - a grant lost with its cleanup: the proxy drops a try's reply (the
//     grant was made) and the next request, the cleanup's Abandon; the try
//     ends at its deadline, and the Locker must abandon the grant again
//     in the background.
//
// After each round the lock key is read until the lost grant is gone; it
// must be gone within lostBound of its caller's return ("orphan"). The
// scenario runs beside the random workload on a resource of its own.
// Its control (TestLockModelLostRepliesControl) is a Locker whose cleanup
// never reaches Redis (every release its client sends after a lost one is
// refused before it is sent): each round leaves a grant standing for its
// whole lease, which the judgment must reject.

// The scenario's kinds and bounds.
const (
	lostRelease = "lost replies judged: a release that never reached Redis"
	// lostReleaseLive is lostRelease when the call failed on a live
	// context (the client's read timed out first).
	lostReleaseLive = "lost replies judged: a release that never reached Redis, its context live"
	lostGrant       = "lost replies judged: a grant whose reply and cleanup were lost"
	// lostBound bounds how long a grant stands after its caller was done
	// with it: a background round trip, on a loaded machine.
	lostBound = time.Second
	// lostTTL is the lost grants' lease: well above lostBound.
	lostTTL = 4 * time.Second
	// lostReleaseWait is the deadline of a lost release, lostTryWait of a
	// try whose cleanup is lost.
	lostReleaseWait = 100 * time.Millisecond
	lostTryWait     = 300 * time.Millisecond
)

// lostScenario runs the scenario's rounds until ctx ends; control makes
// every release after a lost one fail before it is sent.
func (m *model) lostScenario(ctx context.Context, t *testing.T, control bool) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Error(err)
		return
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	opt.Addr = proxy.Addr()
	opt.MaxRetries = -1
	opt.ReadTimeout = 500 * time.Millisecond // a lost request's call ends soon after its caller gave up
	c := redis.NewClient(opt)
	defer c.Close()
	s := &lost{m: m, c: c, proxy: proxy, resource: m.resource + "-lost", rng: rand.New(rand.NewPCG(m.seed, 4000))}
	if control {
		c.AddHook(&cleanupLostHook{s: s})
	}
	s.key = m.prefix + "{" + s.resource + "}:lock"
	l, err := lock.New(c, lock.WithPrefix(m.prefix))
	if err != nil {
		t.Error(err)
		return
	}
	defer l.Close()
	s.l = l
	for i := 0; ctx.Err() == nil; i++ {
		if i%2 == 0 {
			s.releaseLost(ctx)
		} else {
			s.grantLost(ctx)
		}
		time.Sleep(time.Duration(20+s.rng.IntN(30)) * time.Millisecond)
	}
}

// lost is the scenario's state.
type lost struct {
	m        *model
	l        *lock.Locker
	c        *redis.Client
	proxy    *testenv.Proxy
	rng      *rand.Rand
	resource string
	key      string
	// lostOne says a release was lost: the control fails every release
	// after it.
	lostOne atomic.Bool
}

// releaseLost makes a lease and loses its release's request.
func (s *lost) releaseLost(ctx context.Context) {
	lease, err := s.l.TryAcquire(ctx, s.resource, lostTTL)
	if err != nil {
		s.m.count("lost scenario: grants refused", 1)
		return
	}
	// The release goes out on the connection the try used (idle in the
	// pool): its request is the next bytes the client sends.
	s.proxy.DropNextRequest(nil)
	s.lostOne.Store(true)
	// One release in two has a deadline past the client's read timeout:
	// the call fails while its context is live (as on a client that
	// does not retry, or a reset connection), and the Locker must still
	// release again in the background.
	wait, kind := lostReleaseWait, lostRelease
	if s.rng.IntN(2) == 0 {
		wait, kind = 4*lostReleaseWait+time.Second, lostReleaseLive
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	err = lease.Release(rctx)
	cancel()
	done := time.Now()
	if err == nil {
		s.m.count("lost scenario: releases not lost", 1)
	}
	s.judge(lease.Fence().Holder, done, kind)
}

// grantLost loses a try's reply (the grant made) and its cleanup's
// request.
func (s *lost) grantLost(ctx context.Context) {
	if err := s.c.Ping(ctx).Err(); err != nil { // a connection idle in the pool
		return
	}
	before := s.proxy.Faults().Lost
	s.proxy.LoseNextReply(func() { s.proxy.DropNextRequest(nil) })
	tctx, cancel := context.WithTimeout(ctx, lostTryWait)
	lease, err := s.l.TryAcquire(tctx, s.resource, lostTTL)
	cancel()
	done := time.Now()
	if err == nil {
		s.m.count("lost scenario: grant replies not lost", 1)
		_ = lease.Release(context.Background())
		return
	}
	if s.proxy.Faults().Lost == before {
		s.m.count("lost scenario: grant replies not lost", 1)
		return
	}
	s.lostOne.Store(true)
	// Nobody else locks the resource: whoever holds it now is the grant
	// whose reply was lost.
	holder, err := s.c.Get(context.Background(), s.key).Result()
	if err == nil || errors.Is(err, redis.Nil) {
		s.judge(holder, done, lostGrant)
	}
}

// judge reads the lock key until holder no longer holds it: it must be
// gone within lostBound of done.
func (s *lost) judge(holder string, done time.Time, kind string) {
	if holder == "" {
		s.m.count(kind, 1) // gone already
		return
	}
	watcher := s.m.nodes[0].c
	for {
		v, err := watcher.Get(context.Background(), s.key).Result()
		age := time.Since(done)
		if err != nil && !errors.Is(err, redis.Nil) {
			s.m.count("lost scenario: reads failed", 1)
		} else if v != holder {
			s.m.count(kind, 1)
			return
		}
		if age > lostBound {
			s.m.violation("orphan", holder, "%s: the lock stood granted to %s %v after its caller was done with it (bound %v, lease %v)",
				kind, holder[:8], age.Round(time.Millisecond), lostBound, lostTTL)
			// The next round needs the lock free.
			_ = watcher.Del(context.Background(), s.key).Err()
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cleanupLostHook is the control's client: once a release was lost, it
// refuses every release before it is sent, as a network that never
// carries the Locker's cleanup would.
type cleanupLostHook struct{ s *lost }

func (h *cleanupLostHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cleanupLostHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *cleanupLostHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if call, ok := parseScriptCall(cmd.Args()); ok && call.name == "release" && h.s.lostOne.Load() {
			err := fmt.Errorf("control: the cleanup never reaches Redis")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestLockModelLostRepliesControl runs the lost-reply scenario alone with
// a Locker whose cleanup never reaches Redis: the orphan judgment must
// reject it (each round's grant stands for its whole lease).
func TestLockModelLostRepliesControl(t *testing.T) {
	t.Parallel()
	m := newModel(t, modelConfig{seed: modelSeed(t)}, testenv.Prefix(t))
	m.nodes = []*modelNode{{c: testenv.Redis(t)}}
	m.quorum = 1
	ctx, cancel := context.WithTimeout(context.Background(), lostBound)
	defer cancel()
	m.lostScenario(ctx, t, true)
	if n := m.violations("orphan"); n == 0 {
		t.Fatalf("the control (cleanup that never reaches Redis) was not rejected: %d releases and %d grants judged",
			m.stat(lostRelease), m.stat(lostGrant))
	} else {
		t.Logf("control rejected: %d orphans", n)
	}
}
