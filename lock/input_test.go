package lock_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// Every call with a nil context, an overlong resource or an out-of-range
// lease or token is refused with ErrInvalid before anything is sent.
func TestInvalidCallsSendNothing(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	lease := mustAcquire(t, l, "r", 10*time.Second)
	h := &testenv.Commands{}
	c.AddHook(h)

	ctx := context.Background()
	var nilCtx context.Context
	long := strings.Repeat("x", fence.MaxResourceLen+1)
	calls := map[string]func() error{
		"TryAcquire nil ctx": func() error { _, err := l.TryAcquire(nilCtx, "a", time.Second); return err },
		"Acquire nil ctx":    func() error { _, err := l.Acquire(nilCtx, "a", time.Second); return err },
		"Do nil ctx": func() error {
			return l.Do(nilCtx, "a", time.Second, func(context.Context, fence.Fence) error { return nil })
		},
		"Advance nil ctx":        func() error { return l.Advance(nilCtx, "a", 5) },
		"FenceLock nil ctx":      func() error { _, err := l.FenceLock(nilCtx, "k", "v"); return err },
		"FenceLockAbove nil ctx": func() error { _, err := l.FenceLockAbove(nilCtx, "k", "v", 3); return err },
		"Release nil ctx":        func() error { return lease.Release(nilCtx) },
		"Extend nil ctx":         func() error { return lease.Extend(nilCtx, time.Second) },
		"TTL nil ctx":            func() error { _, err := lease.TTL(nilCtx); return err },

		"TryAcquire long resource": func() error { _, err := l.TryAcquire(ctx, long, time.Second); return err },
		"Advance long resource":    func() error { return l.Advance(ctx, long, 1) },
		"TryAcquire NUL resource":  func() error { _, err := l.TryAcquire(ctx, "a\x00b", time.Second); return err },
		"TryAcquire bad UTF-8":     func() error { _, err := l.TryAcquire(ctx, "a\xffb", time.Second); return err },
		"FenceLock long key":       func() error { _, err := l.FenceLock(ctx, long, "v"); return err },
		"TryAcquire lease > MaxTTL": func() error {
			_, err := l.TryAcquire(ctx, "a", lock.MaxTTL+time.Millisecond)
			return err
		},
		"TryAcquire lease MaxInt64": func() error { _, err := l.TryAcquire(ctx, "a", math.MaxInt64); return err },
		"Extend lease MaxInt64":     func() error { return lease.Extend(ctx, math.MaxInt64) },
		"Advance to MaxToken":       func() error { return l.Advance(ctx, "a", fence.MaxToken) },
		"Advance past MaxToken":     func() error { return l.Advance(ctx, "a", 1<<53) },
		"FenceLockAbove MaxToken":   func() error { _, err := l.FenceLockAbove(ctx, "k", "v", fence.MaxToken); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s = %v, want ErrInvalid", name, err)
		}
	}
	if cmds := h.Take(); len(cmds) != 0 {
		t.Fatalf("refused calls sent %v", cmds)
	}
	// A resource of exactly the limit works.
	at := mustAcquire(t, l, strings.Repeat("y", fence.MaxResourceLen), time.Second)
	if err := at.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Backoff saturates at its maximum whatever the minimum and the attempt:
// min·2ⁿ must never wrap around (it did for min of about 17s and more).
func TestBackoffSaturates(t *testing.T) {
	for _, b := range []struct{ min, max time.Duration }{
		{time.Millisecond, 64 * time.Millisecond},
		{17 * time.Second, time.Minute},
		{time.Hour, 2 * time.Hour},
		{math.MaxInt64 / 2, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		w := lock.Backoff(b.min, b.max)
		for attempt := range 200 {
			d := w.Delay(attempt, -1)
			if d < 0 || d > b.max {
				t.Fatalf("Backoff(%v, %v).Delay(%d) = %v, outside [0, max]", b.min, b.max, attempt, d)
			}
		}
	}
}
