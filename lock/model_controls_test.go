package lock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// The model's floors: the least a run of each model must judge of each
// kind, or it fails as having judged too little. They are set for the
// default budget (3 s) on a loaded machine, well below what such a run
// judges; CI's runs of 15 s judge far more (see .ci/fuzz's output). A run
// goes on past its budget until it has judged them (modelConfig.floors).
var (
	lockModelFloors = []modelFloor{
		{kind: "promise checks", min: 100},
		{kind: "token pairs checked", min: 200},
		{kind: "token anchor checks", min: 50},
		{kind: "queue pairs judged", min: 20, after: true},
		// The states in which a try must leave a free lock to a queued
		// waiter, and a release must leave another holder's lock alone.
		{kind: "free-lock tries: a live waiter ahead", min: 2},
		// A late release that meets the lock in another's hands, on each
		// of the release's paths (the late-release scenario); the random
		// workload's late releases meet it too, but too rarely to require.
		{kind: lateFast, min: 3},
		{kind: lateQueued, min: 3},
		{kind: lateGiveUp, min: 3},
		// Grants left by a lost reply, each judged gone within its bound
		// (the lost-reply scenario).
		{kind: lostRelease, min: 1},
		{kind: lostReleaseLive, min: 1},
		{kind: lostGrant, min: 2},
		// The fast path's own queue check decides only over token state a
		// try wrote; a few a run of CI's 15 s, too rare to require of 3 s.
		{kind: "free-lock tries: a live waiter ahead, on the fast path", min: 3, minBudget: 10 * time.Second},
		// A self-renewing lease held past its first validity: a loaded
		// CI run (the lost-reply scenario beside it) judged one in 12 s.
		{kind: "renewals judged", min: 1},
		{kind: "short-start renewals judged", min: 5},
		{kind: "foreign grants", min: 5},
	}
	// A loaded machine runs few Redlock leases (under -race with the
	// machine's cores busy: 3 in 12 s), so these floors only require that
	// each kind judged something.
	redlockModelFloors = []modelFloor{
		{kind: "promise checks", min: 3},
		{kind: "token pairs checked", min: 1},
		{kind: "token anchor checks", min: 2},
		{kind: "node token anchor checks", min: 5},
		{kind: "Redlock quorums checked", min: 2},
	}
)

// brokenLease is a lease that lies: about its validity (it reports a hold
// past its expiry) or about its token (every grant gets the first one).
type brokenLease struct {
	*lock.Lease
	late  time.Duration
	token *atomic.Int64
}

func (b brokenLease) Validity() time.Duration {
	v := b.Lease.Validity()
	if v > 0 {
		v += b.late
	}
	return v
}

func (b brokenLease) Fence() fence.Fence {
	f := b.Lease.Fence()
	if b.token != nil {
		b.token.CompareAndSwap(0, int64(f.Token))
		f.Token = fence.Token(b.token.Load())
	}
	return f
}

// unanchoredHook is the clock-anchor control's broken Locker: every
// acquire.lua it sends issues counter+1 as the token, without the server
// clock under it, so a node that lost its state starts its tokens again
// from 1. Each grant whose token is below the clock counts as exposed.
type unanchoredHook struct {
	m   *model
	src string
}

func (h unanchoredHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h unanchoredHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h unanchoredHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		call, ok := parseScriptCall(cmd.Args())
		if !ok || call.name != "acquire" {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		args[0], args[1] = "eval", h.src
		sent := time.Now()
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil {
			// Gone wrong: a grant whose token is below the clock.
			if r, ok := parseAcquireReply(c.Val()); ok && r.shape == shapeGranted && r.token > 0 && r.token < sent.UnixMicro() {
				h.m.exposed.Add(1)
			}
		}
		return err
	}
}

// unanchoredAcquire is acquire.lua with its tokens cut from the clock.
func unanchoredAcquire(t *testing.T) string {
	return lockmodel.Edited(t, lock.ModelScriptSource("acquire"), "the token's clock anchor",
		"local t = math.max(n + 1, now)", "local t = n + 1")
}

// control runs one broken variant until it has gone wrong (bounded, see
// modelConfig.control) and requires the model to reject it with a
// violation of one of kinds.
func control(t *testing.T, what string, run func(*testing.T, modelConfig) *model, cfg modelConfig, kinds ...string) {
	t.Helper()
	cfg.budget, cfg.seed, cfg.control = min(modelBudget(t), 3*time.Second), modelSeed(t), true
	m := run(t, cfg)
	n := 0
	for _, k := range kinds {
		n += m.violations(k)
	}
	if n == 0 {
		lockmodel.LogControl(t, 0, 1)
		m.report(t, "broken lease model")
		t.Fatalf("the model accepted %s: no %s violation in %v, where the variant went wrong %d times (seed %d)",
			what, strings.Join(kinds, "/"), m.ran.Round(time.Millisecond), m.exposed.Load(), m.seed)
	}
	t.Logf("rejected %s: %d %s violations in %v, where the variant went wrong %d times (seed %d)",
		what, n, strings.Join(kinds, "/"), m.ran.Round(time.Millisecond), m.exposed.Load(), m.seed)
	lockmodel.LogControl(t, 1, 1)
}

// TestLockModelRejectsBrokenLeases is the model's set of negative
// controls: on a workload where today's leases keep their promises, each
// broken variant, one per class of promise the model checks, is caught.
// Each run goes on until its variant has gone wrong a few times.
func TestLockModelRejectsBrokenLeases(t *testing.T) {
	testenv.Slow(t)
	t.Run("honest", func(t *testing.T) {
		// The same workload with the real leases: no violation, so what
		// the broken ones get caught for is theirs.
		m := runModel(t, modelConfig{budget: min(modelBudget(t), 3*time.Second), seed: modelSeed(t), plain: true})
		if len(m.viol) > 0 {
			m.report(t, "plain lock model")
		}
	})
	t.Run("past expiry", func(t *testing.T) {
		control(t, "leases that claim 20ms past their expiry", runModel, modelConfig{plain: true,
			wrap: func(m *model, l *lock.Lease, _ time.Duration) modelLease {
				m.exposed.Add(1)
				return brokenLease{Lease: l, late: 20 * time.Millisecond}
			}}, "promise")
	})
	t.Run("reused token", func(t *testing.T) {
		first := new(atomic.Int64)
		control(t, "grants that reuse one token", runModel, modelConfig{plain: true,
			wrap: func(m *model, l *lock.Lease, _ time.Duration) modelLease {
				m.exposed.Add(1)
				return brokenLease{Lease: l, token: first}
			}}, "token")
	})
	t.Run("try skips the queue", func(t *testing.T) {
		control(t, "a Locker whose tries ignore the queue", runModel,
			// A jump counts once it became a lease, and the judge dates a
			// try or a poll from its winning script's send and reply; it
			// finds two to four violations a counted jump (17 to 29 in runs
			// of 5 to 9 jumps, -race). Five jumps leave a wide margin.
			modelConfig{plain: true, minExposed: 5, hook: func(m *model) redis.Hook { return skipQueueHook{m} }},
			"queue", "queue-try", "queue-poll")
	})
	t.Run("fast try skips the queue", func(t *testing.T) {
		control(t, "a fast try that grants a free lock without looking at the queue", runModel,
			modelConfig{plain: true, hook: fastTryWithoutQueue(t)},
			"queue", "queue-try", "queue-poll")
	})
	t.Run("release without the holder check", func(t *testing.T) {
		control(t, "a release that frees the lock whoever holds it", runModel,
			modelConfig{plain: true, hook: releaseWithoutHolderCheck(t)}, "promise", "release")
	})
	t.Run("renewal at the lease's end", func(t *testing.T) {
		control(t, "a renewal scheduled at the lease's end", runModel,
			modelConfig{plain: true, renewAtEnd: true}, "renewal")
	})
	t.Run("renewal from the nominal ttl", func(t *testing.T) {
		control(t, "a renewal scheduled from the nominal ttl rather than from what is left", runModel,
			modelConfig{plain: true, renewNominal: true}, "renewal-short")
	})
	t.Run("Redlock token without its clock anchor", func(t *testing.T) {
		src := unanchoredAcquire(t)
		control(t, "Redlock tokens issued without their clock anchor", runRedlockModel,
			modelConfig{hook: func(m *model) redis.Hook { return unanchoredHook{m, src} }},
			"anchor", "token")
	})
	t.Run("Redlock validity without drift", func(t *testing.T) {
		// A loaded machine grants few Redlock leases and checks fewer
		// (3 granted, none checked, in a failed run of 5 s): the run goes
		// on until three were checked.
		control(t, "Redlock leases whose validity has no drift allowance", runRedlockModel, modelConfig{plain: true, longLeases: true, exposeOnCheck: true,
			wrap: func(m *model, l *lock.Lease, ttl time.Duration) modelLease {
				return brokenLease{Lease: l, late: lockmodel.RedlockDrift(ttl)}
			}}, "promise")
	})
}

// swapHook is a broken Locker that sends its own source for one script
// (by EVAL, so the model's outer hooks still read the call as that
// script's) and counts, through exposed, each reply whose call went wrong
// in a way the model's judges can see.
type swapHook struct {
	m       *model
	name    string
	src     string
	exposed func(m *model, call scriptCall, c *redis.Cmd, sent time.Time)
}

func (h swapHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h swapHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h swapHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		call, ok := parseScriptCall(cmd.Args())
		if !ok || call.name != h.name {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		args[0], args[1] = "eval", h.src
		sent := time.Now()
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil {
			h.exposed(h.m, call, c, sent)
		}
		return err
	}
}

// breakScript returns the named script's source with each pair's old text
// replaced by its new one, once, failing t when an old text is no longer in
// it.
func breakScript(t *testing.T, name string, oldNew ...string) string {
	t.Helper()
	src := lock.ModelScriptSource(name)
	for i := 0; i+1 < len(oldNew); i += 2 {
		if !strings.Contains(src, oldNew[i]) {
			t.Fatalf("%q is no longer in the %s script: update the control", oldNew[i], name)
		}
		src = strings.Replace(src, oldNew[i], oldNew[i+1], 1)
	}
	return src
}

// fastTryWithoutQueue is the try script whose fast path (try_fast.lua)
// grants a free lock without looking at the queue: a free lock with
// waiters queued goes to the caller. A grant from that path while a
// waiter was provably live and ahead counts as exposed once it became a
// lease (model.jumped).
func fastTryWithoutQueue(t *testing.T) func(m *model) redis.Hook {
	src := breakScript(t, "try", "redis.call('EXISTS', KEYS[1], KEYS[3] or KEYS[1]) == 0", "redis.call('EXISTS', KEYS[1]) == 0")
	return func(m *model) redis.Hook {
		return swapHook{m: m, name: "try", src: src, exposed: func(m *model, call scriptCall, c *redis.Cmd, sent time.Time) {
			if _, granted := c.Val().(string); granted && len(call.keys) == 3 && m.waiterAhead(call.argv[0], sent) {
				m.gmu.Lock()
				m.jumped[call.argv[0]] = true
				m.gmu.Unlock()
			}
		}}
	}
}

// releaseWithoutHolderCheck is the release script without its holder
// check, on its fast path (release_plain.lua, nobody queued) and on its
// full path (release.lua) alike: a release after the lease ran out frees
// the next holder's lock, or hands it over to the first waiter. It answers
// 7 when it did so to another holder's lock, which the hook counts as
// exposed and turns back into the 1 such a release would answer.
func releaseWithoutHolderCheck(t *testing.T) func(m *model) redis.Hook {
	src := releaseWithoutHolderCheckSource(t)
	return func(m *model) redis.Hook {
		return swapHook{m: m, name: "release", src: src, exposed: func(m *model, _ scriptCall, c *redis.Cmd, _ time.Time) {
			if n, ok := c.Val().(int64); ok && n == 7 {
				m.exposed.Add(1)
				c.SetVal(int64(1))
			}
		}}
	}
}

// releaseWithoutHolderCheckSource is the release script of
// releaseWithoutHolderCheck: it answers 7 where it freed another holder's
// lock.
func releaseWithoutHolderCheckSource(t *testing.T) string {
	return breakScript(t, "release",
		"  if redis.call('GET', KEYS[1]) ~= ARGV[1] then\n    return 0\n  end\n  if redis.call('EXISTS', KEYS[4]) == 0 then\n    redis.call('DEL', KEYS[1])\n    return 1\n  end",
		"  if redis.call('EXISTS', KEYS[4]) == 0 then\n    local cur = redis.call('GET', KEYS[1])\n    redis.call('DEL', KEYS[1])\n    if cur and cur ~= ARGV[1] then\n      return 7\n    end\n    return 1\n  end",
		"local holder = ARGV[1]\nlocal acq = ARGV[3] or ''\n",
		"local freed_other = false\nlocal holder = ARGV[1]\nlocal acq = ARGV[3] or ''\n",
		// The full path reads the lock itself here, whatever the broken
		// fast path found, so that it counts what it frees.
		"elseif not held_by_caller and redis.call('GET', KEYS[1]) ~= holder then\n  return not_held()\nend",
		"elseif redis.call('GET', KEYS[1]) ~= holder then\n  if not redis.call('GET', KEYS[1]) then\n    return not_held()\n  end\n  freed_other = true\nend",
		"    publish(channel, sharded, '')\n  end\nend\nreturn 1\n",
		"    publish(channel, sharded, '')\n  end\nend\nif freed_other then\n  return 7\nend\nreturn 1\n")
}
