package lock_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// tokenState reads a resource's token state: the counter n, the current
// grant's token g and the mark h of its holder (a prefix of the holder id).
func tokenState(t *testing.T, c redis.Cmdable, l *lock.Locker, resource string) (n, g fence.Token, h string) {
	t.Helper()
	v, err := c.Get(context.Background(), keysOf(l).TokenKey(resource)).Result()
	if err != nil {
		t.Fatalf("token state of %q: %v", resource, err)
	}
	f := strings.Fields(v)
	if len(f) == 2 { // "n h": the grant's token is n
		f = []string{f[0], f[0], f[1]}
	}
	if len(f) != 3 {
		t.Fatalf("token state of %q is %q, want \"n h\" or \"n g h\"", resource, v)
	}
	pn, _ := strconv.ParseInt(f[0], 10, 64)
	pg, _ := strconv.ParseInt(f[1], 10, 64)
	return fence.Token(pn), fence.Token(pg), f[2]
}

func grantAndRelease(t *testing.T, l *lock.Locker, resource string) fence.Token {
	t.Helper()
	lease := mustAcquire(t, l, resource, time.Second)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lease.Fence().Token
}

// Token state expires the retention after the last lease, and the next
// grant's token is still above every earlier one.
func TestTokenStateExpiresAfterRetention(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c, lock.WithTokenRetention(50*time.Millisecond))
	lease := mustAcquire(t, l, "r", 200*time.Millisecond)
	if pttl := c.PTTL(ctx, keysOf(l).TokenKey("r")).Val(); pttl <= 200*time.Millisecond || pttl > 250*time.Millisecond {
		t.Fatalf("token state PTTL %v, want lease + retention (250ms)", pttl)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("r")).Val(); n != 0 {
		t.Fatal("lock key exists after release")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Exists(ctx, keysOf(l).TokenKey("r")).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("token state still there 5s after its retention")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if next := grantAndRelease(t, l, "r"); next <= lease.Fence().Token {
		t.Fatalf("token after the retention window %d, want above %d", next, lease.Fence().Token)
	}
}

// Locking many distinct resources once leaves nothing behind once the
// retention has passed: Redis memory returns to its baseline. Run with
// FENCEKIT_TOKEN_MEMORY_RESOURCES=100000 for the figures in the README.
func TestTokenStateMemoryReturnsToBaseline(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	resources := 2000
	if v, err := strconv.Atoi(os.Getenv("FENCEKIT_TOKEN_MEMORY_RESOURCES")); err == nil && v > 0 {
		resources = v
	}
	// Every state must still be there when the last grant is made, also on
	// a loaded machine, where a grant can take a millisecond or more.
	retention := 2*time.Second + time.Duration(resources)*time.Millisecond
	l, err := lock.New(c, lock.WithTokenRetention(retention))
	if err != nil {
		t.Fatal(err)
	}
	grantAndRelease(t, l, "warm") // loads the scripts
	waitKeys(t, c, 0, retention+10*time.Second)
	base := usedMemory(t, c)
	const workers = 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := w; j < resources; j += workers {
				grantAndRelease(t, l, "order:"+strconv.Itoa(j))
			}
		})
	}
	wg.Wait()
	held := usedMemory(t, c)
	keys := c.DBSize(ctx).Val()
	if keys != int64(resources) {
		t.Fatalf("%d keys after %d grants and releases, want one token state each", keys, resources)
	}
	waitKeys(t, c, 0, retention+30*time.Second)
	// Redis shrinks its emptied key tables in its cron; wait for that too.
	after := usedMemory(t, c)
	for deadline := time.Now().Add(10 * time.Second); after > base+64*1024 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		after = usedMemory(t, c)
	}
	t.Logf("%d resources: used_memory %d B before, %d B with token state (%.1f B/resource), %d B after the retention",
		resources, base, held, float64(held-base)/float64(resources), after)
	if after > base+64*1024 {
		t.Fatalf("used_memory %d B after the retention, baseline %d B", after, base)
	}
}

func waitKeys(t *testing.T, c *redis.Client, want int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := c.DBSize(context.Background()).Val()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left, want %d", n, want)
		}
		// Active expiry samples keys; a SCAN touches each and expires it.
		c.Scan(context.Background(), 0, "*", 1000)
		time.Sleep(20 * time.Millisecond)
	}
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info := c.Info(context.Background(), "memory").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

// Tokens strictly increase after the lock's Redis lost everything, with no
// Advance: a FLUSHALL, and a kill -9 and restart without persistence.
func TestTokensIncreaseAfterDataLoss(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	l, err := lock.New(srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	for _, fault := range []struct {
		name string
		do   func()
	}{{"FLUSHALL", srv.Flush}, {"kill -9 and restart", srv.Restart}} {
		last := grantAndRelease(t, l, "r")
		fault.do()
		var lease *lock.Lease
		deadline := time.Now().Add(5 * time.Second)
		for lease == nil && time.Now().Before(deadline) {
			lease, err = l.TryAcquire(ctx, "r", time.Second) // the pool's old connections fail first
		}
		if err != nil {
			t.Fatalf("%s: %v", fault.name, err)
		}
		if lease.Fence().Token <= last {
			t.Fatalf("%s: token %d after %d", fault.name, lease.Fence().Token, last)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The clock assumption, broken on purpose: a counter that ran ahead of the
// clock (here by Advance) and is then lost makes the next token go back.
// Storage refuses it, and Advance with the refused mark heals it.
func TestAdvanceHealsWhenTheClockIsBehind(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	l, err := lock.New(srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	first := grantAndRelease(t, l, "r")
	ahead := first + fence.Token(time.Hour/time.Microsecond) // an hour ahead of the clock
	if err := l.Advance(ctx, "r", ahead); err != nil {
		t.Fatal(err)
	}
	if got := grantAndRelease(t, l, "r"); got != ahead+1 {
		t.Fatalf("after Advance(%d): token %d, want %d", ahead, got, ahead+1)
	}
	// The state lives until the clock has caught up, plus the retention.
	if pttl := srv.Client().PTTL(ctx, keysOf(l).TokenKey("r")).Val(); pttl < time.Hour {
		t.Fatalf("token state PTTL %v while its counter is an hour ahead of the clock", pttl)
	}
	srv.Restart()
	var lease *lock.Lease
	deadline := time.Now().Add(5 * time.Second)
	for lease == nil && time.Now().Before(deadline) {
		lease, err = l.TryAcquire(ctx, "r", time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	if lease.Fence().Token > ahead {
		t.Fatalf("token %d after losing a counter ahead of the clock; the test cannot see the clock assumption fail", lease.Fence().Token)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Advance(ctx, "r", ahead+1); err != nil {
		t.Fatal(err)
	}
	if got := grantAndRelease(t, l, "r"); got <= ahead+1 {
		t.Fatalf("after Advance(%d): token %d", ahead+1, got)
	}
}

func TestAdvanceNeverLowers(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	last := grantAndRelease(t, l, "r")
	if err := l.Advance(ctx, "r", 3); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := tokenState(t, c, l, "r"); n != last {
		t.Fatalf("Advance below the counter moved it to %d from %d", n, last)
	}
	// A missing state starts at the advanced value.
	far := fence.MaxToken - 10
	if err := l.Advance(ctx, "fresh", far); err != nil {
		t.Fatal(err)
	}
	if got := grantAndRelease(t, l, "fresh"); got != far+1 {
		t.Fatalf("after Advance on a missing state: token %d, want %d", got, far+1)
	}
	if err := l.Advance(ctx, "r", -1); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Advance(-1) = %v", err)
	}
}

// At the top of the token space the lock fails clearly instead of
// repeating a token, and leaves no lock behind; a counter past int64's or
// the doubles' range is refused before anything is written.
func TestTokenSpaceLimit(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	if err := l.Advance(ctx, "r", fence.MaxToken-2); err != nil {
		t.Fatal(err)
	}
	if got := grantAndRelease(t, l, "r"); got != fence.MaxToken-1 {
		t.Fatalf("token %d, want %d", got, fence.MaxToken-1)
	}
	if got := grantAndRelease(t, l, "r"); got != fence.MaxToken {
		t.Fatalf("token %d, want fence.MaxToken", got)
	}
	if _, err := l.TryAcquire(ctx, "r", time.Second); !errors.Is(err, lock.ErrTokensExhausted) {
		t.Fatalf("grant past fence.MaxToken = %v, want ErrTokensExhausted", err)
	}
	if n := c.Exists(ctx, keysOf(l).LockKey("r")).Val(); n != 0 {
		t.Fatal("a refused grant left a lock behind")
	}
	for _, v := range []string{"9223372036854775807", "9007199254740992", "18446744073709551616"} {
		r := "big" + v
		c.Set(ctx, keysOf(l).TokenKey(r), v, 0)
		_, err := l.TryAcquire(ctx, r, time.Second)
		if !errors.Is(err, fence.ErrWrongType) {
			t.Errorf("counter %s: %v, want ErrWrongType", v, err)
		}
		if n := c.Exists(ctx, keysOf(l).LockKey(r)).Val(); n != 0 {
			t.Errorf("counter %s: an orphan lock was left behind", v)
		}
		if got := c.Get(ctx, keysOf(l).TokenKey(r)).Val(); got != v {
			t.Errorf("counter %s changed to %s", v, got)
		}
	}
}

// A counter written by an earlier release of this package (a bare decimal
// with no expiry) is read, and the next token is above it.
func TestLegacyCounterIsRead(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	legacy := fence.MaxToken - 100
	c.Set(ctx, keysOf(l).TokenKey("r"), strconv.FormatInt(int64(legacy), 10), 0)
	if got := grantAndRelease(t, l, "r"); got != legacy+1 {
		t.Fatalf("token after a legacy counter %d: %d", legacy, got)
	}
	if pttl := c.PTTL(ctx, keysOf(l).TokenKey("r")).Val(); pttl < 0 {
		t.Fatalf("the legacy counter kept no expiry (PTTL %v)", pttl)
	}
}

func TestWithTokenRetentionValidates(t *testing.T) {
	c := testenv.Redis(t)
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond, lock.MaxTTL + 1} {
		if _, err := lock.New(c, lock.WithTokenRetention(d)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("WithTokenRetention(%v) = %v, want ErrInvalid", d, err)
		}
	}
	if _, err := lock.New(c, lock.WithTokenRetention(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// The fast grant compares the counter with the server clock as text. Each
// state below sits on one side of that comparison; the token must be the
// clock when the counter is behind it and the counter + 1 when it is not,
// whatever the counter's length or leading zeros.
func TestGrantComparesCounterWithClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	l := newLocker(t, c)
	now := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	ahead := now() + int64(time.Hour/time.Microsecond)
	for name, tc := range map[string]struct {
		state string
		want  func(before int64) (lo, hi int64)
	}{
		"short counter":         {"5 abcdefgh", func(b int64) (int64, int64) { return b, b + int64(time.Minute/time.Microsecond) }},
		"leading zeros, behind": {"0000000000000005 abcdefgh", func(b int64) (int64, int64) { return b, b + int64(time.Minute/time.Microsecond) }},
		"same length, ahead":    {strconv.FormatInt(ahead, 10) + " abcdefgh", func(int64) (int64, int64) { return ahead + 1, ahead + 1 }},
		"long form, ahead":      {strconv.FormatInt(ahead, 10) + " 7 abcdefgh", func(int64) (int64, int64) { return ahead + 1, ahead + 1 }},
		"bare counter, ahead":   {strconv.FormatInt(ahead, 10), func(int64) (int64, int64) { return ahead + 1, ahead + 1 }},
	} {
		resource := "cmp-" + strings.ReplaceAll(name, " ", "-")
		if err := c.Set(ctx, keysOf(l).TokenKey(resource), tc.state, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		before := now()
		got := int64(grantAndRelease(t, l, resource))
		lo, hi := tc.want(before)
		if got < lo || got > hi {
			t.Errorf("%s: state %q gave token %d, want %d..%d", name, tc.state, got, lo, hi)
		}
		if n, _, _ := tokenState(t, c, l, resource); int64(n) != got {
			t.Errorf("%s: the state's counter is %d after granting %d", name, n, got)
		}
	}
}
