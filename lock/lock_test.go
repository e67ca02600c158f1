package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

func newLocker(t *testing.T, c redis.UniversalClient, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.New(c, append([]lock.Option{lock.WithPrefix(testenv.Prefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustAcquire(t *testing.T, l *lock.Locker, resource string, ttl time.Duration) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), resource, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", resource, err)
	}
	return lease
}

// waitLost polls until the lease has expired in Redis.
func waitLost(t *testing.T, lease *lock.Lease) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := lease.TTL(context.Background()); errors.Is(err, lock.ErrNotHeld) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("lease did not expire within 5s")
}

// eventually polls cond until it holds, failing t with what after 5s: for
// cleanup that a call leaves to the background once its context ended.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
	}
}

// keyGone reports whether key does not exist.
func keyGone(c redis.UniversalClient, key string) func() bool {
	return func() bool { return c.Exists(context.Background(), key).Val() == 0 }
}

func TestTokensIncreasePerGrant(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, testenv.Redis(t))
	var last fence.Token
	for i := range 300 { // back to back, many within one millisecond
		lease := mustAcquire(t, l, "orders", time.Second)
		if lease.Fence().Token <= last || lease.Fence().Token > fence.MaxToken {
			t.Fatalf("grant %d got token %d after %d", i, lease.Fence().Token, last)
		}
		if f := lease.Fence(); f.Resource != "orders" || f.Token != lease.Fence().Token || len(f.Holder) != 32 {
			t.Fatalf("fence %v", f)
		}
		last = lease.Fence().Token
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Another resource has its own state, so its tokens do not wait for
	// this one's.
	if got := mustAcquire(t, l, "invoices", time.Second).Fence().Token; got < 1 {
		t.Fatalf("first grant of another resource got token %d", got)
	}
}

func TestHolderIsFreshPerGrant(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, testenv.Redis(t))
	a := mustAcquire(t, l, "r", time.Second)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, l, "r", time.Second)
	if a.Fence().Holder == b.Fence().Holder {
		t.Fatal("two grants share a holder id")
	}
}

func TestReacquireAfterExpiryGetsNextToken(t *testing.T) {
	l := newLocker(t, testenv.Redis(t))
	a := mustAcquire(t, l, "r", 20*time.Millisecond)
	waitLost(t, a)
	b := mustAcquire(t, l, "r", time.Second)
	if b.Fence().Token <= a.Fence().Token {
		t.Fatalf("after expiry token %d, want above %d", b.Fence().Token, a.Fence().Token)
	}
}

func TestExtendKeepsTokenAndLease(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c, lock.WithTokenRetention(time.Second))
	lease := mustAcquire(t, l, "r", 100*time.Millisecond)
	if err := lease.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	ttl, err := lease.TTL(ctx)
	if err != nil || ttl < 30*time.Second {
		t.Fatalf("TTL after Extend = %v, %v; want about a minute", ttl, err)
	}
	// The extended lease still excludes others, and a retried grant still
	// finds its own token.
	if _, err := l.TryAcquire(ctx, "r", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on extended lock: %v", err)
	}
	// The token state lives at least as long as the extended lease.
	if pttl := c.PTTL(ctx, keysOf(l).TokenKey("r")).Val(); pttl < 30*time.Second {
		t.Fatalf("token state PTTL %v after Extend(1m)", pttl)
	}
	if _, err := l.TryAcquire(ctx, "r", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on extended lock: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustAcquire(t, l, "r", time.Second).Fence().Token; got <= lease.Fence().Token {
		t.Fatalf("next grant token %d, want above %d", got, lease.Fence().Token)
	}
}

func TestStaleLeaseCannotReleaseOrExtend(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, testenv.Redis(t))
	a := mustAcquire(t, l, "r", 20*time.Millisecond)
	waitLost(t, a)
	b := mustAcquire(t, l, "r", time.Minute)

	if err := a.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("stale Release = %v, want ErrNotHeld", err)
	}
	if err := a.Extend(ctx, time.Hour); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("stale Extend = %v, want ErrNotHeld", err)
	}
	if _, err := a.TTL(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("stale TTL = %v, want ErrNotHeld", err)
	}
	ttl, err := b.TTL(ctx)
	if err != nil || ttl < 30*time.Second || ttl > time.Minute {
		t.Fatalf("new holder's lease after stale calls: %v, %v", ttl, err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("new holder's Release: %v", err)
	}
	if err := b.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
}

func TestTryAcquireHeldFailsAtOnceWithRemaining(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	held := mustAcquire(t, l, "r", 10*time.Second)
	state := c.Get(ctx, keysOf(l).TokenKey("r")).Val()
	_, err := l.TryAcquire(ctx, "r", time.Second)
	var na *lock.NotAcquiredError
	if !errors.As(err, &na) || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on held lock = %v, want NotAcquiredError", err)
	}
	if na.Resource != "r" || na.Remaining <= 0 || na.Remaining > 10*time.Second {
		t.Fatalf("NotAcquiredError = %+v", na)
	}
	// The refusal changed nothing.
	if after := c.Get(ctx, keysOf(l).TokenKey("r")).Val(); after != state {
		t.Fatalf("token state %q after a refused attempt, was %q", after, state)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAcquireWaitsForRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := newLocker(t, testenv.Redis(t))
	held := mustAcquire(t, l, "r", time.Minute)

	released := make(chan struct{})
	got := make(chan *lock.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, "r", time.Second)
		if err != nil {
			t.Error(err)
		}
		select {
		case <-released:
		default:
			t.Error("Acquire returned before the holder released")
		}
		got <- lease
	}()
	time.Sleep(20 * time.Millisecond) // let the waiter be refused at least once
	close(released)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case lease := <-got:
		if lease == nil || lease.Fence().Token <= held.Fence().Token {
			t.Fatalf("waiter got %v", lease)
		}
	case <-ctx.Done():
		t.Fatal("Acquire did not return after release")
	}
}

func TestCancelledAcquireLeavesNoLock(t *testing.T) {
	c := testenv.Redis(t)
	l := newLocker(t, c)
	held := mustAcquire(t, l, "r", time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := l.Acquire(ctx, "r", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past deadline = %v, want DeadlineExceeded", err)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The waiter leaves the queue in the background; a grant that reached
	// it meanwhile is given back.
	eventually(t, "a cancelled Acquire left a lock behind", keyGone(c, keysOf(l).LockKey("r")))

	done, stop := context.WithCancel(context.Background())
	stop()
	if _, err := l.TryAcquire(done, "r", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with cancelled ctx = %v", err)
	}
	if n := c.Exists(context.Background(), keysOf(l).LockKey("r")).Val(); n != 0 {
		t.Fatal("a cancelled TryAcquire left a lock behind")
	}
}

// loseReply is a go-redis hook that lets a command run on the server and then
// reports the caller's context as cancelled: the reply lost in flight.
type loseReply struct {
	cancel context.CancelFunc
	armed  atomic.Bool
}

func (h *loseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.armed.CompareAndSwap(true, false) {
			h.cancel()
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}
}

func TestReplyLostInFlightLeavesNoLock(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	l := newLocker(t, c)
	// Load the script so the one command sent is the acquisition itself.
	lease := mustAcquire(t, l, "r", time.Minute)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	h := &loseReply{cancel: cancel}
	c.AddHook(h)
	h.armed.Store(true)
	_, err = l.TryAcquire(ctx, "r", time.Minute)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with lost reply = %v, want context.Canceled", err)
	}
	eventually(t, "the granted-but-unreported lock was left behind", keyGone(c, keysOf(l).LockKey("r")))
	// The lost grant's token was issued, and the next one is above it.
	n, g, _ := tokenState(t, c, l, "r")
	if n <= lease.Fence().Token || g != n {
		t.Fatalf("token state after the lost grant: n=%d g=%d, want both above %d", n, g, lease.Fence().Token)
	}
	if got := mustAcquire(t, l, "r", time.Second).Fence().Token; got <= n {
		t.Fatalf("token after a lost grant: %d, want above %d", got, n)
	}
}

func TestOneCommandToAcquireOneToRelease(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	l := newLocker(t, c)
	warm := mustAcquire(t, l, "warm", time.Second) // loads both scripts
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h := &testenv.Commands{}
	c.AddHook(h)

	lease := mustAcquire(t, l, "r", time.Second)
	if n := len(h.Take()); n != 1 {
		t.Fatalf("TryAcquire sent %d commands, want 1", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(h.Take()); n != 1 {
		t.Fatalf("Release sent %d commands, want 1", n)
	}
	if _, err := l.TryAcquire(ctx, "r", 0); err == nil {
		t.Fatal("ttl 0 accepted")
	}
	if n := h.Len(); n != 0 {
		t.Fatalf("rejected input sent %d commands", n)
	}
}

func TestClusterOneSlotPerResource(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartRedisCluster(t)
	c := srv.ClusterClient()
	l, err := lock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"orders", "user:42", "a b c", "ünïcode"} {
		a, b := keysOf(l).LockKey(r), keysOf(l).TokenKey(r)
		sa, sb := c.ClusterKeySlot(ctx, a).Val(), c.ClusterKeySlot(ctx, b).Val()
		if sa != sb {
			t.Fatalf("%q: lock key slot %d, counter slot %d", r, sa, sb)
		}
		// A two-key script across slots would fail with CROSSSLOT here.
		lease, err := l.TryAcquire(ctx, r, time.Second)
		if err != nil {
			t.Fatalf("TryAcquire on cluster: %v", err)
		}
		if err := lease.Extend(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Advance(ctx, r, 10); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNoOverlappingLeases(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := newLocker(t, testenv.Redis(t))
	const workers, rounds = 16, 25
	var inside atomic.Int32
	var lastToken atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				lease, err := l.Acquire(ctx, "shared", 5*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside the critical section", n)
				}
				if prev := lastToken.Swap(int64(lease.Fence().Token)); prev >= int64(lease.Fence().Token) {
					t.Errorf("token %d granted after %d", lease.Fence().Token, prev)
				}
				// Still valid at the end of the critical section.
				if _, err := lease.TTL(ctx); err != nil {
					t.Errorf("lease lost inside the critical section: %v", err)
				}
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	boom := errors.New("boom")
	var seen fence.Fence
	err := l.Do(ctx, "r", time.Second, func(ctx context.Context, f fence.Fence) error {
		seen = f
		if n := c.Exists(ctx, keysOf(l).LockKey("r")).Val(); n != 1 {
			t.Error("lock not held inside Do")
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if seen.Token < 1 || seen.Resource != "r" || seen.Holder == "" {
		t.Fatalf("fn saw fence %v", seen)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("r")).Val(); n != 0 {
		t.Fatal("Do did not release")
	}
	// A lease lost while fn ran is reported. Do renews the lease, so it is
	// lost by deleting it behind the holder's back; fn returns nil once its
	// context says so.
	err = l.Do(ctx, "r", 30*time.Millisecond, func(ctx context.Context, f fence.Fence) error {
		if err := c.Del(ctx, keysOf(l).LockKey("r")).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Do with expired lease = %v, want ErrNotHeld", err)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := lock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(nil) = %v", err)
	}
	var typedNil *redis.Client
	if _, err := lock.New(typedNil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(typed nil) = %v", err)
	}
	c := testenv.Redis(t)
	if _, err := lock.New(c, lock.WithPrefix("a{b}")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("prefix with braces = %v", err)
	}
	if _, err := lock.New(c, lock.WithWait(nil)); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("nil wait = %v", err)
	}
	l := newLocker(t, c)
	for _, tc := range []struct {
		resource string
		ttl      time.Duration
	}{{"", time.Second}, {"a{b", time.Second}, {"r", 0}, {"r", -time.Second}, {"r", time.Microsecond}} {
		if _, err := l.TryAcquire(ctx, tc.resource, tc.ttl); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("TryAcquire(%q, %v) = %v, want ErrInvalid", tc.resource, tc.ttl, err)
		}
		if _, err := l.Acquire(ctx, tc.resource, tc.ttl); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Acquire(%q, %v) = %v, want ErrInvalid", tc.resource, tc.ttl, err)
		}
	}
	lease := mustAcquire(t, l, "r", time.Second)
	if err := lease.Extend(ctx, 0); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Extend(0) = %v", err)
	}
	if err := l.Do(ctx, "r", time.Second, nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Do(nil) = %v", err)
	}
	keys, _ := c.Keys(ctx, keysOf(l).TokenKey("")[:len(keysOf(l).TokenKey(""))-len("{}:token")]+"*").Result()
	if len(keys) != 2 { // only r's lock and counter
		t.Fatalf("rejected calls wrote keys: %v", keys)
	}
}

func TestWrongTypeKeysAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)

	// A hash where the lock key should be.
	c.HSet(ctx, keysOf(l).LockKey("h"), "f", "v")
	if _, err := l.TryAcquire(ctx, "h", time.Second); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("lock key is a hash: %v", err)
	}
	if v := c.HGet(ctx, keysOf(l).LockKey("h"), "f").Val(); v != "v" {
		t.Fatal("hash lock key was changed")
	}
	if n := c.Exists(ctx, keysOf(l).TokenKey("h")).Val(); n != 0 {
		t.Fatal("counter was created although the lock key is wrong")
	}

	// A list where the counter should be.
	c.RPush(ctx, keysOf(l).TokenKey("l"), "x")
	if _, err := l.TryAcquire(ctx, "l", time.Second); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("counter is a list: %v", err)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("l")).Val(); n != 0 {
		t.Fatal("lock was taken although the counter is wrong")
	}
	if err := l.Advance(ctx, "l", 5); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("Advance on a list counter: %v", err)
	}
	if v := c.LRange(ctx, keysOf(l).TokenKey("l"), 0, -1).Val(); len(v) != 1 || v[0] != "x" {
		t.Fatalf("list counter was changed: %v", v)
	}

	// A string that is not an integer.
	c.Set(ctx, keysOf(l).TokenKey("s"), "abc", 0)
	if _, err := l.TryAcquire(ctx, "s", time.Second); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("counter is not an integer: %v", err)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("s")).Val(); n != 0 {
		t.Fatal("lock was taken although the counter is not an integer")
	}
}

func TestClientRetryOfAcquireReturnsTheGrant(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	l := newLocker(t, c)
	warm := mustAcquire(t, l, "r", time.Second) // loads the script
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h := &testenv.Replay{}
	c.AddHook(h)
	h.Arm(0)
	lease, err := l.TryAcquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire whose first run's reply was lost: %v", err)
	}
	n, g, holder := tokenState(t, c, l, "r")
	if lease.Fence().Token != g || n != g || !strings.HasPrefix(lease.Fence().Holder, holder) || lease.Fence().Token <= warm.Fence().Token {
		t.Fatalf("retried grant got token %d holder %s; state n=%d g=%d h=%s (one grant since %d)",
			lease.Fence().Token, lease.Fence().Holder, n, g, holder, warm.Fence().Token)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("the retried grant is not the caller's: %v", err)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("r")).Val(); n != 0 {
		t.Fatal("a lock is left behind")
	}
}
