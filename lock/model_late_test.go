package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// The late-release scenario: the state in which a release's holder check
// decides, made on purpose rather than waited for. A lease runs out while
// its holder still holds on to it, the lock is granted to another lease,
// and only then does the first one release. Its release must answer "not
// held" and leave the lock to the second, on both of the release's paths:
//
//   - the fast path (release_plain.lua), which a lease without owner takes
//     when nobody is queued: the scenario's resource has no waiter;
//   - with a waiter queued: the scenario's own waiter is queued behind
//     the second lease, and a release that ignored the holder would hand
//     the lock over to it. The fast path's holder check comes before its
//     queue check, so it refuses this release too; without it the release
//     goes on to release.lua (the full path), whose own check decides.
//
// In that second kind of round the waiter then gives up, while the second
// lease still holds the lock: a give-up is a release too (of whatever the
// waiter may have been handed meanwhile), which always takes the full path
// and must leave another holder's lock alone ("waiter give-ups judged").
//
// The scenario runs beside the random workload on a resource of its own,
// which nothing else locks: whether anyone is queued there is the
// scenario's doing, so each late release's path is known, not guessed.
// Right after each late release the model checks every live promise, the
// second lease's included; a late release judged so counts by path
// ("late releases judged: fast path" and "...: a waiter queued", each with
// its floor). A late release that reports success is a violation by
// itself ("release"): the second grant proves the first one's key was
// gone before it was sent.

// The scenario's kinds: late releases by the path they take, and the
// waiter's give-ups.
const (
	lateFast   = "late releases judged: fast path (nobody queued)"
	lateQueued = "late releases judged: a waiter queued"
	lateGiveUp = "waiter give-ups judged: the lock in other hands"
)

// lateScenario runs the scenario's rounds on its own resource until ctx
// ends, alternating between nobody queued and a waiter queued.
func (m *model) lateScenario(ctx context.Context, t *testing.T, cfg modelConfig) {
	c := testenv.Redis(t)
	if cfg.hook != nil {
		c.AddHook(cfg.hook(m))
	}
	l, err := lock.New(c, lock.WithPrefix(m.prefix))
	if err != nil {
		t.Error(err)
		return
	}
	defer l.Close()
	// The waiter has a client and a Locker of its own, so that its
	// subscription is not the holders' and its give-up is seen.
	wc := testenv.Redis(t)
	gaveUp := make(chan struct{}, 1)
	wc.AddHook(giveUpHook{gaveUp})
	if cfg.hook != nil {
		wc.AddHook(cfg.hook(m))
	}
	wl, err := lock.New(wc, lock.WithPrefix(m.prefix))
	if err != nil {
		t.Error(err)
		return
	}
	defer wl.Close()
	s := &late{m: m, l: l, wl: wl, c: c, gaveUp: gaveUp, rng: rand.New(rand.NewPCG(m.seed, 3000)),
		resource: m.resource + "-late"}
	s.key = m.prefix + "{" + s.resource + "}:lock"
	s.queue = m.prefix + "{" + s.resource + "}:queue"
	for i := 0; ctx.Err() == nil; i++ {
		s.round(ctx, i%2 == 1)
		// A few dozen rounds a budget are plenty; the random workload
		// keeps the rest of the machine.
		s.pause(ctx, time.Duration(20+s.rng.IntN(30))*time.Millisecond)
	}
}

// late is the scenario's state.
type late struct {
	m             *model
	l, wl         *lock.Locker
	c             *redis.Client
	rng           *rand.Rand
	gaveUp        chan struct{} // a waiter's give-up reached Redis
	resource      string
	key, queue    string
	first, second *held
	waiterDone    chan struct{}
	waiterMu      sync.Mutex
	waiterLease   *lock.Lease
	cancelWaiter  context.CancelFunc
}

// hold registers lease l as a hold whose promise the model checks against
// the scenario's key.
func (s *late) hold(l *lock.Lease, kind string, ttl time.Duration, start time.Time) *held {
	g := &grant{f: l.Fence(), kind: kind, ttl: ttl, start: start, end: time.Now(), actor: -1}
	ml := s.m.wrap(s.m, l, ttl)
	h := &held{l: ml, g: g, startLeft: l.Validity(), key: s.key}
	s.m.mu.Lock()
	s.m.holds[h] = struct{}{}
	s.m.mu.Unlock()
	return h
}

// drop withdraws h's promise and releases it, under the model's lock as
// every call that ends a promise is; it returns the release's error.
func (s *late) drop(h *held) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	delete(s.m.holds, h)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return h.l.Release(ctx)
}

// round makes one late release, on the full path when queued is set and
// on the fast path otherwise.
func (s *late) round(ctx context.Context, queued bool) {
	m := s.m
	defer s.cleanup()
	// The first lease: short, so that it soon runs out.
	ttl := []time.Duration{25, 40, 60}[s.rng.IntN(3)] * time.Millisecond
	start := time.Now()
	first, err := s.l.TryAcquire(ctx, s.resource, ttl)
	if err != nil {
		m.count("late scenario: first grants refused", 1)
		s.pause(ctx, 5*time.Millisecond)
		return
	}
	s.first = s.hold(first, "late-first", ttl, start)
	// Its holder pauses past its end; then the lock is another lease's.
	// The key may outlive the validity by a little (the validity is
	// counted from the request's send): the try is made again until then.
	s.pause(ctx, max(s.first.l.Validity(), 0)+time.Duration(s.rng.IntN(5))*time.Millisecond)
	// Long enough for the waiter to queue and the check to be conclusive
	// on a loaded machine; the round releases it well before.
	const secondTTL = 2 * time.Second
	for s.second == nil && ctx.Err() == nil && time.Since(start) < ttl+time.Second {
		start2 := time.Now()
		second, err := s.l.TryAcquire(ctx, s.resource, secondTTL)
		if err != nil {
			s.pause(ctx, time.Millisecond)
			continue
		}
		s.second = s.hold(second, "late-second", secondTTL, start2)
	}
	if s.second == nil {
		m.count("late scenario: second grants missed", 1)
		return
	}
	kind := lateFast
	if queued {
		kind = lateQueued
		if !s.queueWaiter(ctx) {
			m.count("late scenario: waiter not queued in time", 1)
			return
		}
	} else if n, err := s.c.Exists(ctx, s.queue).Result(); err != nil || n != 0 {
		// Nobody else locks this resource, and the last round's waiter
		// left the queue before this round began.
		m.count("late scenario: queue not empty", 1)
		return
	}
	// The late release: its lease ran out, and another holds the lock.
	lateErr := s.drop(s.first)
	s.first = nil
	m.count("late releases (scenario)", 1)
	_, _, v := m.checkPromises(context.Background(), s.second)
	if lateErr == nil {
		m.violation("release", fmt.Sprintf("%p", s.second), "a release of a lease that had run out reported success while a later grant held the lock (token %d, waiter queued: %v)",
			s.second.g.f.Token, queued)
	} else if !errors.Is(lateErr, lock.ErrNotHeld) {
		m.count("late scenario: releases failed otherwise", 1)
		m.note("a late release failed: %v", lateErr)
	}
	if v == verdictKept || v == verdictBroken {
		m.count(kind, 1)
	} else {
		m.count("late scenario: checks inconclusive", 1)
	}
	if queued {
		s.giveUp()
	}
}

// giveUp makes the round's waiter give up while the second lease holds
// the lock, and checks the promises once its give-up reached Redis.
func (s *late) giveUp() {
	m := s.m
	select {
	case <-s.gaveUp: // an earlier round's, seen late
	default:
	}
	s.cancelWaiter()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-s.gaveUp:
	case <-t.C:
		m.count("late scenario: give-ups not seen", 1)
		return
	}
	if _, _, v := m.checkPromises(context.Background(), s.second); v == verdictKept || v == verdictBroken {
		m.count(lateGiveUp, 1)
	} else {
		m.count("late scenario: checks inconclusive", 1)
	}
}

// giveUpHook signals on ch each time a waiter's give-up (the release
// script with its fourth argument "1") has been answered.
type giveUpHook struct{ ch chan struct{} }

func (h giveUpHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h giveUpHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h giveUpHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if call, ok := parseScriptCall(cmd.Args()); ok && call.name == "release" && len(call.argv) >= 4 && call.argv[3] == "1" {
			select {
			case h.ch <- struct{}{}:
			default:
			}
		}
		return err
	}
}

// queueWaiter starts the round's waiter and reports once its queue entry
// is in place; the waiter waits behind the second lease until the round
// releases that one.
func (s *late) queueWaiter(ctx context.Context) bool {
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	s.cancelWaiter = cancel
	s.waiterDone = make(chan struct{})
	go func() {
		defer close(s.waiterDone)
		l, err := s.wl.Acquire(wctx, s.resource, 50*time.Millisecond)
		if err == nil {
			s.waiterMu.Lock()
			s.waiterLease = l
			s.waiterMu.Unlock()
		}
	}()
	for ctx.Err() == nil {
		if n, err := s.c.ZCard(ctx, s.queue).Result(); err == nil && n > 0 {
			return true
		}
		select {
		case <-s.waiterDone:
			return false
		case <-time.After(time.Millisecond):
		}
	}
	return false
}

// cleanup ends what a round left: its leases, its waiter.
func (s *late) cleanup() {
	for _, h := range []*held{s.first, s.second} {
		if h != nil {
			_ = s.drop(h)
		}
	}
	s.first, s.second = nil, nil
	if s.waiterDone != nil {
		<-s.waiterDone
		s.cancelWaiter()
		s.waiterMu.Lock()
		if s.waiterLease != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = s.waiterLease.Release(ctx)
			cancel()
		}
		s.waiterLease = nil
		s.waiterMu.Unlock()
		s.waiterDone = nil
	}
}

func (s *late) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
