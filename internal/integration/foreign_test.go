package integration_test

// FenceLock against the real libraries it is documented for: redsync and
// bsm/redislock.

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// newLocker returns a Locker whose keys live under the test's own prefix.
func newLocker(t *testing.T, c redis.UniversalClient, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.New(c, append([]lock.Option{lock.WithPrefix(testenv.Prefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustFence(t *testing.T, l *lock.Locker, key, value string) fence.Fence {
	t.Helper()
	f, err := l.FenceLock(context.Background(), key, value)
	if err != nil {
		t.Fatalf("FenceLock(%q): %v", key, err)
	}
	if f.Resource != key || f.Holder != value || f.Validate() != nil {
		t.Fatalf("FenceLock(%q, %q) = %v", key, value, f)
	}
	return f
}

// waitGone polls until key no longer exists (the foreign lease expired).
func waitGone(t *testing.T, c redis.Cmdable, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c.Exists(context.Background(), key).Val() == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%q did not expire within 5s", key)
}

func TestFenceLockRedsync(t *testing.T) {
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	rs := redsync.New(rsgoredis.NewPool(c))
	key := p + "report"

	m := rs.NewMutex(key, redsync.WithExpiry(time.Second), redsync.WithTries(1))
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	first := mustFence(t, l, m.Name(), m.Value())
	if again := mustFence(t, l, m.Name(), m.Value()); again != first {
		t.Fatalf("second call in one grant: %v, first %v", again, first)
	}
	if ok, err := m.Extend(); !ok || err != nil {
		t.Fatalf("Extend: %v %v", ok, err)
	}
	if again := mustFence(t, l, m.Name(), m.Value()); again != first {
		t.Fatalf("after Extend: %v, first %v", again, first)
	}
	if ok, err := m.Unlock(); !ok || err != nil {
		t.Fatalf("Unlock: %v %v", ok, err)
	}
	if _, err := l.FenceLock(context.Background(), m.Name(), m.Value()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("FenceLock after Unlock = %v, want ErrNotHeld", err)
	}

	prev := first
	for range 5 {
		m := rs.NewMutex(key, redsync.WithExpiry(time.Second), redsync.WithTries(1))
		if err := m.Lock(); err != nil {
			t.Fatal(err)
		}
		f := mustFence(t, l, m.Name(), m.Value())
		if f.Token <= prev.Token {
			t.Fatalf("new grant got token %d after %d", f.Token, prev.Token)
		}
		prev = f
		if ok, err := m.Unlock(); !ok || err != nil {
			t.Fatalf("Unlock: %v %v", ok, err)
		}
	}
}

func TestFenceLockRedislock(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	rl := redislock.New(c)
	key := p + "invoice:7"

	old, err := rl.Obtain(ctx, key, 300*time.Millisecond, &redislock.Options{Metadata: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	oldValue := old.Token() + old.Metadata() // what redislock stores
	first := mustFence(t, l, old.Key(), oldValue)

	// Concurrent calls for one grant all get its token.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			f, err := l.FenceLock(ctx, old.Key(), oldValue)
			if err != nil || f != first {
				t.Errorf("concurrent FenceLock = %v, %v; want %v", f, err, first)
			}
		})
	}
	wg.Wait()
	// The token alone is not the stored value when there is metadata.
	if _, err := l.FenceLock(ctx, key, old.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("FenceLock with the token part only = %v, want ErrNotHeld", err)
	}

	// The lease runs out and another holder takes the lock.
	waitGone(t, c, key)
	next, err := rl.Obtain(ctx, key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.FenceLock(ctx, key, oldValue); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("old holder's FenceLock = %v, want ErrNotHeld", err)
	}
	f := mustFence(t, l, next.Key(), next.Token())
	if f.Token <= first.Token {
		t.Fatalf("next holder got token %d after %d", f.Token, first.Token)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFenceLockStableAcrossRefresh extends a lease far past its first TTL:
// the grant keeps its token, because the record outlives the lease it first
// saw.
func TestFenceLockStableAcrossRefresh(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	lk, err := redislock.Obtain(ctx, c, p+"job", 200*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := mustFence(t, l, lk.Key(), lk.Token())
	if err := lk.Refresh(ctx, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the first TTL
	if got := mustFence(t, l, lk.Key(), lk.Token()); got != first {
		t.Fatalf("after Refresh past the first TTL: %v, want %v", got, first)
	}
	if rec, lease := c.PTTL(ctx, fenceKey(l, lk.Key())).Val(), c.PTTL(ctx, lk.Key()).Val(); rec != -1 && rec < lease {
		t.Fatalf("fence record PTTL %v expires before the lease (%v)", rec, lease)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A lock without expiry is fenced too.
	c.Set(ctx, p+"forever", "v1", 0)
	if f := mustFence(t, l, p+"forever", "v1"); f.Token <= 0 {
		t.Fatalf("lock without expiry got token %d", f.Token)
	}
}

// TestFenceLockHealsAfterRecordLoss: the last grant's token runs an hour
// ahead of the clock (as after an earlier FenceLockAbove), then Redis loses
// the fence record (a restart of a private server without persistence), so
// a new grant's token falls back to the clock, below the store's mark, and
// storage refuses it; FenceLockAbove with the mark from the refusal makes the
// grant's writes admissible again.
func TestFenceLockHealsAfterRecordLoss(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	l, err := lock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	store, err := fkredis.New(testenv.Redis(t), fkredis.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	rl := redislock.New(c)
	var last fence.Fence
	for range 3 {
		lk, err := rl.Obtain(ctx, "acct", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		last = mustFence(t, l, lk.Key(), lk.Token())
		if last, err = l.FenceLockAbove(ctx, lk.Key(), lk.Token(), last.Token+3_600_000_000); err != nil {
			t.Fatal(err)
		}
		if _, err := store.FencedSet(ctx, last, "acct", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart()
	var lk *redislock.Lock
	deadline := time.Now().Add(5 * time.Second)
	for lk == nil && time.Now().Before(deadline) {
		lk, err = rl.Obtain(ctx, "acct", time.Minute, nil) // the pool's old connections fail first
	}
	if err != nil {
		t.Fatal(err)
	}
	f := mustFence(t, l, lk.Key(), lk.Token())
	if f.Token > last.Token {
		t.Fatalf("restart kept the record (token %d); the test cannot see its loss", f.Token)
	}
	_, err = store.FencedSet(ctx, f, "acct", []byte("y"))
	hwm, ok := fence.LostTo(err)
	if !ok {
		t.Fatalf("low token after the loss was not refused: %v", err)
	}
	f, err = l.FenceLockAbove(ctx, lk.Key(), lk.Token(), hwm.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.FencedSet(ctx, f, "acct", []byte("y")); err != nil {
		t.Fatalf("write after FenceLockAbove: %v", err)
	}
}

// TestFenceLockTokensIncreaseUnderContention: workers take one redislock
// lock in turn; inside each grant the token is above every earlier grant's.
func TestFenceLockTokensIncreaseUnderContention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	rl := redislock.New(c)
	const workers, rounds = 8, 25
	var last, grants atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				lk, err := rl.Obtain(ctx, p+"shared", 5*time.Second,
					&redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)})
				if err != nil {
					t.Error(err)
					return
				}
				f, err := l.FenceLock(ctx, lk.Key(), lk.Token())
				if err != nil {
					t.Error(err)
					return
				}
				if prev := last.Swap(int64(f.Token)); prev >= int64(f.Token) {
					t.Errorf("token %d issued after %d", f.Token, prev)
				}
				grants.Add(1)
				if err := lk.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := grants.Load(); got != workers*rounds {
		t.Fatalf("%d grants fenced, want %d", got, workers*rounds)
	}
}

// foreignLib takes a lock with another library and returns its key, the
// value it stored there, and its release.
type foreignLib struct {
	name   string
	obtain func(t *testing.T, c *redis.Client, key string, ttl time.Duration) (k, value string, release func())
}

var foreignLibs = []foreignLib{
	{"redsync", func(t *testing.T, c *redis.Client, key string, ttl time.Duration) (string, string, func()) {
		m := redsync.New(rsgoredis.NewPool(c)).NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
		if err := m.Lock(); err != nil {
			t.Fatalf("redsync Lock: %v", err)
		}
		return m.Name(), m.Value(), func() { _, _ = m.Unlock() }
	}},
	{"redislock", func(t *testing.T, c *redis.Client, key string, ttl time.Duration) (string, string, func()) {
		lk, err := redislock.Obtain(context.Background(), c, key, ttl, nil)
		if err != nil {
			t.Fatalf("redislock Obtain: %v", err)
		}
		return lk.Key(), lk.Token() + lk.Metadata(), func() { _ = lk.Release(context.Background()) }
	}},
}

// TestFencedForeignLockLosesNoUpdate runs the timeline of a lost update under
// each library's lock: A reads, pauses past its lease, B takes the lock,
// reads and writes the increment, then A writes its increment. Fenced (a
// FenceLock fence on every read and write of a storage/redis store), A's late
// write is refused and every acknowledged increment is in the final value.
// The control, the same timeline under the lock alone, must lose B's update,
// or the test cannot see a loss.
func TestFencedForeignLockLosesNoUpdate(t *testing.T) {
	for _, lib := range foreignLibs {
		for _, fenced := range []bool{true, false} {
			name := lib.name + "/fenced"
			if !fenced {
				name = lib.name + "/lock-only"
			}
			t.Run(name, func(t *testing.T) {
				acked, final := lostUpdateTimeline(t, lib, fenced)
				lost := 10 + acked - final
				t.Logf("acknowledged increments %d, final value %d, lost %d", acked, final, lost)
				switch {
				case fenced && lost != 0:
					t.Fatalf("fenced: %d acknowledged increment(s) lost", lost)
				case !fenced && lost == 0:
					t.Fatal("control: the lock alone lost nothing; the test cannot see lost updates")
				}
			})
		}
	}
}

func lostUpdateTimeline(t *testing.T, lib foreignLib, fenced bool) (acked, final int) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	store, err := fkredis.New(c, fkredis.WithPrefix(p+"data:"))
	if err != nil {
		t.Fatal(err)
	}
	lockKey, dataKey := p+"account", "balance"
	plainKey := p + "plain:" + dataKey

	// Each holder's read and write, fenced or not.
	read := func(f fence.Fence) int {
		var s string
		if fenced {
			v, err := store.FencedGet(ctx, f, dataKey)
			if err != nil {
				t.Fatalf("fenced read: %v", err)
			}
			s = string(v.Data)
		} else {
			s = c.Get(ctx, plainKey).Val()
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("read %q: %v", s, err)
		}
		return n
	}
	write := func(f fence.Fence, n int) error {
		if fenced {
			_, err := store.FencedSet(ctx, f, dataKey, []byte(strconv.Itoa(n)))
			return err
		}
		return c.Set(ctx, plainKey, n, 0).Err()
	}
	grant := func(ttl time.Duration) (fence.Fence, func()) {
		k, v, release := lib.obtain(t, c, lockKey, ttl)
		return mustFence(t, l, k, v), release
	}

	f0, release := grant(time.Minute) // seed the value under a first grant
	if err := write(f0, 10); err != nil {
		t.Fatal(err)
	}
	release()

	fA, _ := grant(300 * time.Millisecond)
	a := read(fA)
	waitGone(t, c, lockKey) // A pauses past its lease

	fB, releaseB := grant(time.Minute)
	if fB.Token <= fA.Token {
		t.Fatalf("B's token %d is not above A's %d", fB.Token, fA.Token)
	}
	if err := write(fB, read(fB)+1); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	acked++
	releaseB()

	// A wakes up and writes what it computed before the pause.
	switch err := write(fA, a+1); {
	case err == nil:
		acked++
	case fenced && errors.Is(err, fence.ErrStale):
		if _, err := l.FenceLock(ctx, fA.Resource, fA.Holder); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("A's FenceLock after losing the lock = %v, want ErrNotHeld", err)
		}
	default:
		t.Fatalf("A's late write: %v", err)
	}

	s := c.Get(ctx, plainKey).Val()
	if fenced {
		v, err := store.Load(ctx, dataKey)
		if err != nil {
			t.Fatal(err)
		}
		s = string(v.Data)
	}
	final, err = strconv.Atoi(s)
	if err != nil {
		t.Fatalf("final value %q: %v", s, err)
	}
	return acked, final
}

// BenchmarkRedislockFenced is a redislock grant, FenceLock and release:
// what fencing adds to BenchmarkRedislockPlain.
func BenchmarkRedislockFenced(b *testing.B) { benchRedislock(b, true) }

// BenchmarkRedislockPlain is a redislock grant and release, for comparison.
func BenchmarkRedislockPlain(b *testing.B) { benchRedislock(b, false) }

func benchRedislock(b *testing.B, fenced bool) {
	ctx := context.Background()
	c := testenv.Redis(b)
	p := testenv.Prefix(b)
	l, err := lock.New(c, lock.WithPrefix(p))
	if err != nil {
		b.Fatal(err)
	}
	rl := redislock.New(c)
	b.ReportAllocs()
	for b.Loop() {
		lk, err := rl.Obtain(ctx, p+"k", time.Second, nil)
		if err != nil {
			b.Fatal(err)
		}
		if fenced {
			if _, err := l.FenceLock(ctx, lk.Key(), lk.Token()); err != nil {
				b.Fatal(err)
			}
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFenceLockParallel fences distinct redislock grants from parallel
// goroutines.
func BenchmarkFenceLockParallel(b *testing.B) {
	ctx := context.Background()
	c := testenv.Redis(b)
	p := testenv.Prefix(b)
	l, err := lock.New(c, lock.WithPrefix(p))
	if err != nil {
		b.Fatal(err)
	}
	rl := redislock.New(c)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := p + "k" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			lk, err := rl.Obtain(ctx, key, time.Second, nil)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := l.FenceLock(ctx, lk.Key(), lk.Token()); err != nil {
				b.Error(err)
				return
			}
			if err := lk.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
