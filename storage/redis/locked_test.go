package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// workload is the lock-set workload of DESIGN.md section 6: workers acquire a
// real lock with a short lease, read, sometimes pause past the lease, write
// and release. increment performs read, pause and write under the lease's
// fence.
type workload struct {
	workers, rounds int
	ttl             func() time.Duration
	pause           func() time.Duration
}

type tally struct {
	mu             sync.Mutex
	acked, refused int // increments acknowledged / refused as stale
	lost           int // leases found expired at release
	otherErrs      []error
}

func (w workload) run(t *testing.T, locker *lock.Locker, increment func(ctx context.Context, f fence.Fence, pause time.Duration) error) *tally {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var tl tally
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() {
			for range w.rounds {
				lease, err := locker.Acquire(ctx, "counter", w.ttl())
				if err != nil {
					tl.mu.Lock()
					tl.otherErrs = append(tl.otherErrs, err)
					tl.mu.Unlock()
					return
				}
				err = increment(ctx, lease.Fence(), w.pause())
				relErr := lease.Release(ctx)
				tl.mu.Lock()
				switch {
				case err == nil:
					tl.acked++
				case errors.Is(err, fence.ErrStale):
					tl.refused++
				default:
					tl.otherErrs = append(tl.otherErrs, err)
				}
				if errors.Is(relErr, lock.ErrNotHeld) {
					tl.lost++
				}
				tl.mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range tl.otherErrs {
		t.Errorf("unexpected error: %v", err)
	}
	return &tl
}

func newWorkload() workload {
	return workload{
		workers: 8,
		rounds:  20,
		ttl:     func() time.Duration { return 20*time.Millisecond + rand.N(30*time.Millisecond) },
		pause: func() time.Duration {
			if rand.N(3) == 0 {
				return rand.N(60 * time.Millisecond) // often past the lease
			}
			return 0
		},
	}
}

// TestLockedIncrementsWithExpiringLeases runs concurrent fenced
// read-modify-write increments whose tokens come from the real lock, with
// leases of 20-50ms and pauses up to 60ms, so that some leases expire in
// the middle of an increment. Every acknowledged increment must be in the
// final value, and the tokens of accepted writes must increase.
func TestLockedIncrementsWithExpiringLeases(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	c := testenv.Redis(t)
	locker, err := lock.New(c, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c, WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	tl := newWorkload().run(t, locker, func(ctx context.Context, f fence.Fence, pause time.Duration) error {
		_, err := s.FencedUpdate(ctx, f, "n", func(old Value) ([]byte, error) {
			n, prevTok := 0, fence.Token(0)
			if old.Exists {
				var err error
				if n, prevTok, err = parseEntry(old.Data); err != nil {
					return nil, err
				}
			}
			// Accepted tokens never decrease: each write carries a newer
			// token than the write before it.
			if prevTok >= f.Token {
				t.Errorf("fenced read by token %d admitted after a write by token %d", f.Token, prevTok)
			}
			time.Sleep(pause) // the holder stalls between read and write
			return fmt.Appendf(nil, "%d:%d", n+1, f.Token), nil
		})
		return err
	})
	v, err := s.Load(context.Background(), "n")
	if err != nil {
		t.Fatal(err)
	}
	final, _, err := parseEntry(v.Data)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fenced: %d acknowledged, %d refused as stale, %d leases expired before release, final value %d",
		tl.acked, tl.refused, tl.lost, final)
	if final != tl.acked {
		t.Fatalf("final value %d, but %d increments were acknowledged", final, tl.acked)
	}
	if tl.lost == 0 || tl.refused == 0 {
		t.Fatalf("no lease expired mid-operation (%d lost, %d refused): the workload did not exercise the fault", tl.lost, tl.refused)
	}
}

// TestLockedIncrementsNegativeControl runs the same workload under the same
// lock with plain GET and SET and must lose an acknowledged increment;
// otherwise the test above could not see a loss either.
func TestLockedIncrementsNegativeControl(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	c := testenv.Redis(t)
	locker, err := lock.New(c, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	key := testenv.Prefix(t) + "n"
	tl := newWorkload().run(t, locker, func(ctx context.Context, _ fence.Fence, pause time.Duration) error {
		n, err := c.Get(ctx, key).Int()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return err
		}
		time.Sleep(pause)
		return c.Set(ctx, key, n+1, 0).Err()
	})
	final, err := c.Get(context.Background(), key).Int()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plain GET/SET: %d acknowledged, %d leases expired before release, final value %d", tl.acked, tl.lost, final)
	if final >= tl.acked {
		t.Fatalf("plain GET/SET under the lock lost nothing (%d acknowledged, final %d): the workload cannot show a lost update", tl.acked, final)
	}
}

// parseEntry reads a counter value written as "count:token".
func parseEntry(b []byte) (int, fence.Token, error) {
	n, tok, ok := strings.Cut(string(b), ":")
	count, err1 := strconv.Atoi(n)
	token, err2 := strconv.ParseInt(tok, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("entry %q is not count:token", b)
	}
	return count, fence.Token(token), nil
}

// TestLockCounterLossHeals keeps the lock on a private Redis that loses its
// data (DESIGN.md section 4): the lock's tokens are anchored to the server's
// clock, so its next grant is above the store's mark and is admitted without
// anyone calling Advance, with no acknowledged increment lost.
func TestLockCounterLossHeals(t *testing.T) {
	t.Parallel()
	lockSrv := testenv.StartRedis(t)
	locker, err := lock.New(lockSrv.Client())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newStore(t)
	ctx := context.Background()
	acked := 0
	increment := func() error {
		return locker.Do(ctx, "counter", time.Second, func(ctx context.Context, f fence.Fence) error {
			_, err := s.FencedUpdate(ctx, f, "n", func(old Value) ([]byte, error) {
				n, _ := strconv.Atoi(string(old.Data))
				return strconv.AppendInt(nil, int64(n+1), 10), nil
			})
			return err
		})
	}
	for range 5 {
		if err := increment(); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	before, err := s.HighWater(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	lockSrv.Flush() // the lock's Redis loses its token state
	if err := increment(); err != nil {
		t.Fatalf("increment after the lock's Redis lost its data: %v", err)
	}
	acked++
	after, err := s.HighWater(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if after.Token <= before.Token {
		t.Fatalf("mark went from token %d to %d; want it raised", before.Token, after.Token)
	}
	v, err := s.Load(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(string(v.Data)); n != acked {
		t.Fatalf("value %d after %d acknowledged increments", n, acked)
	}
}
