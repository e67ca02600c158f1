package history

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// Budget is how long one checker run generates operations, and the seed of
// its random choices.
type Budget struct {
	Duration time.Duration
	Seed     uint64
}

// DefaultDuration is a run's length without FENCEKIT_CHECK_TIME: a few
// seconds, enough for the plain test run to exercise every path.
const DefaultDuration = 4 * time.Second

// ShortDuration is a run's length under -short.
const ShortDuration = 2 * time.Second

// BudgetFor reads FENCEKIT_CHECK_TIME (a Go duration, such as 45s or 5m)
// and FENCEKIT_CHECK_SEED (a decimal seed that replays a run's choices);
// without them a run lasts DefaultDuration (ShortDuration under -short) and
// takes a random seed. It logs both, so that a failure can be replayed.
func BudgetFor(t testing.TB) Budget {
	t.Helper()
	b := Budget{Duration: DefaultDuration, Seed: rand.Uint64()}
	if testing.Short() {
		b.Duration = ShortDuration
	}
	if v := os.Getenv("FENCEKIT_CHECK_TIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("FENCEKIT_CHECK_TIME=%q: want a positive duration such as 45s", v)
		}
		b.Duration = d
	}
	if v := os.Getenv("FENCEKIT_CHECK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FENCEKIT_CHECK_SEED=%q: want a decimal seed", v)
		}
		b.Seed = s
	}
	t.Logf("budget %v, seed %d (replay: FENCEKIT_CHECK_SEED=%d)", b.Duration, b.Seed, b.Seed)
	return b
}

// A negative control's run proves something about the checker only if its
// broken variant actually went wrong in it: a write admitted that the sound
// code would have refused, or applied on a stale read. How often that
// happens in a few seconds depends on the machine's load, so a control's
// run does not stop at its budget until its variant has counted
// minExposed such writes (its exposures), and stops at exposureCap budgets
// at the latest.
const (
	minExposed  = 3
	exposureCap = 4
)

// runContext returns the context a run's workers run under. With exposed
// nil (a sound run) it ends after b.Duration. Otherwise it ends once
// b.Duration has passed and exposed holds at least minExposed, or after
// exposureCap times b.Duration. The caller must call the cancel function.
func runContext(b Budget, exposed *atomic.Int64) (context.Context, context.CancelFunc) {
	if exposed == nil {
		return context.WithTimeout(context.Background(), b.Duration)
	}
	ctx, cancel := context.WithTimeout(context.Background(), exposureCap*b.Duration)
	go func() {
		t := time.NewTimer(b.Duration)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for exposed.Load() < minExposed {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		cancel()
	}()
	return ctx, cancel
}

// runContextUntil returns the context a sound run's workers run under: it
// ends once b.Duration has passed and done reports true (polled every
// 100ms), or after exposureCap times b.Duration. A run whose floors bind
// goes on so until it has judged them: how long a loaded machine takes to
// make each kind varies, what the run must have judged does not.
func runContextUntil(b Budget, done func() bool) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), exposureCap*b.Duration)
	go func() {
		t := time.NewTimer(b.Duration)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !done() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		cancel()
	}()
	return ctx, cancel
}

// String names the budget for logs and failures.
func (b Budget) String() string { return fmt.Sprintf("%v, seed %d", b.Duration, b.Seed) }

// checkUnmarked reports the calls that may have written and were left open
// with an error that does not match fence.ErrOutcomeUnknown, which the
// design asks of every write whose outcome the library cannot tell. It logs
// them; with FENCEKIT_CHECK_STRICT_UNKNOWN=1 it fails the test too.
func checkUnmarked(t testing.TB, store string, n int64) {
	t.Helper()
	if n == 0 {
		return
	}
	msg := fmt.Sprintf("%s: %d calls that may have written ended in an error that does not match fence.ErrOutcomeUnknown", store, n)
	if os.Getenv("FENCEKIT_CHECK_STRICT_UNKNOWN") == "1" {
		t.Error(msg)
		return
	}
	t.Log(msg)
}
