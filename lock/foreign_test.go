package lock_test

// Tests of FenceLock that need no other lock library: a plain SET NX PX
// stands in for the foreign lock. The tests against real redsync and
// redislock live in the internal/integration module, so that those
// libraries stay out of this module's requirements.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

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

func TestFenceLockRefusalChangesNothing(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	key := p + "k"

	if _, err := l.FenceLock(ctx, key, "v"); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("missing lock key: %v, want ErrNotHeld", err)
	}
	if n := c.Exists(ctx, fenceKey(l, key)).Val(); n != 0 {
		t.Fatal("a refused call created the fence record")
	}
	c.Set(ctx, key, "mine", time.Minute)
	f := mustFence(t, l, key, "mine")
	before := c.HGetAll(ctx, fenceKey(l, key)).Val()
	for _, v := range []string{"theirs", "min", "mine "} {
		if _, err := l.FenceLock(ctx, key, v); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("lock holds another value, FenceLock(%q) = %v", v, err)
		}
		if _, err := l.FenceLockAbove(ctx, key, v, 100); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("lock holds another value, FenceLockAbove(%q) = %v", v, err)
		}
	}
	if after := c.HGetAll(ctx, fenceKey(l, key)).Val(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refused calls changed the record: %v -> %v", before, after)
	}
	if got := mustFence(t, l, key, "mine"); got != f {
		t.Fatalf("after refusals: %v, want %v", got, f)
	}
	if v := c.Get(ctx, key).Val(); v != "mine" {
		t.Fatalf("lock key changed to %q", v)
	}
}

func TestFenceLockAbove(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	key := p + "k"
	c.Set(ctx, key, "g1", time.Minute)
	first := mustFence(t, l, key, "g1").Token
	// Below the grant's token nothing changes; at it (a store saw another
	// holder with the same token) the grant needs a new one, once.
	for _, floor := range []fence.Token{0, first - 1} {
		if f, err := l.FenceLockAbove(ctx, key, "g1", floor); err != nil || f.Token != first {
			t.Fatalf("FenceLockAbove(%d) = %v, %v; want token %d", floor, f, err, first)
		}
	}
	second, err := l.FenceLockAbove(ctx, key, "g1", first)
	if err != nil || second.Token <= first {
		t.Fatalf("FenceLockAbove(%d) = %v, %v; want a token above it", first, second, err)
	}
	for _, floor := range []fence.Token{first, 0} {
		if f, err := l.FenceLockAbove(ctx, key, "g1", floor); err != nil || f.Token != second.Token {
			t.Fatalf("FenceLockAbove(%d) again = %v, %v; want token %d", floor, f, err, second.Token)
		}
	}
	// Above it, the grant gets a new token, and keeps it.
	above := second.Token + fence.Token(time.Hour/time.Microsecond) // ahead of the clock
	f, err := l.FenceLockAbove(ctx, key, "g1", above)
	if err != nil || f.Token != above+1 {
		t.Fatalf("FenceLockAbove(%d) = %v, %v; want token %d", above, f, err, above+1)
	}
	if got := mustFence(t, l, key, "g1"); got.Token != above+1 {
		t.Fatalf("FenceLock after FenceLockAbove: token %d, want %d", got.Token, above+1)
	}
	c.Set(ctx, key, "g2", time.Minute)
	if got := mustFence(t, l, key, "g2"); got.Token != above+2 {
		t.Fatalf("next grant: token %d, want %d", got.Token, above+2)
	}
	// Tokens near the 2^53 limit keep every digit.
	big := fence.Token(1<<53 - 2)
	if f, err := l.FenceLockAbove(ctx, key, "g2", big); err != nil || f.Token != big+1 {
		t.Fatalf("FenceLockAbove(%d) = %v, %v", big, f, err)
	}
	if v := c.HGet(ctx, fenceKey(l, key), "token").Val(); v != strconv.FormatInt(int64(big+1), 10) {
		t.Fatalf("record token %q", v)
	}
}

func TestFenceLockWrongType(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))

	c.HSet(ctx, p+"h", "f", "v")
	if _, err := l.FenceLock(ctx, p+"h", "v"); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("lock key is a hash: %v", err)
	}
	if n := c.Exists(ctx, fenceKey(l, p+"h")).Val(); n != 0 {
		t.Fatal("record created although the lock key is wrong")
	}

	c.Set(ctx, p+"a", "v", time.Minute)
	c.RPush(ctx, fenceKey(l, p+"a"), "x")
	if _, err := l.FenceLock(ctx, p+"a", "v"); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("record is a list: %v", err)
	}
	if v := c.LRange(ctx, fenceKey(l, p+"a"), 0, -1).Val(); len(v) != 1 || v[0] != "x" {
		t.Fatalf("list record changed: %v", v)
	}

	c.Set(ctx, p+"b", "v", time.Minute)
	c.HSet(ctx, fenceKey(l, p+"b"), "token", "abc", "value", "old")
	if _, err := l.FenceLockAbove(ctx, p+"b", "v", 5); !errors.Is(err, fence.ErrWrongType) {
		t.Fatalf("record token is not an integer: %v", err)
	}
	if v := c.HGetAll(ctx, fenceKey(l, p+"b")).Val(); v["token"] != "abc" || v["value"] != "old" {
		t.Fatalf("bad record changed: %v", v)
	}
	for _, k := range []string{p + "a", p + "b"} {
		if v := c.Get(ctx, k).Val(); v != "v" {
			t.Fatalf("lock key %q changed to %q", k, v)
		}
	}
}

func TestFenceLockBadInput(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	l := newLocker(t, c)
	h := &testenv.Commands{}
	c.AddHook(h)
	ctx := context.Background()
	for _, tc := range []struct{ key, value string }{{"", "v"}, {"k", ""}} {
		if _, err := l.FenceLock(ctx, tc.key, tc.value); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("FenceLock(%q, %q) = %v, want ErrInvalid", tc.key, tc.value, err)
		}
	}
	for _, floor := range []fence.Token{-1, fence.MaxToken, 1 << 53} {
		if _, err := l.FenceLockAbove(ctx, "k", "v", floor); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("FenceLockAbove(%d) = %v, want ErrInvalid", floor, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.FenceLock(done, "k", "v"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled FenceLock = %v", err)
	}
	if n := h.Len(); n != 0 {
		t.Fatalf("rejected calls sent %d commands", n)
	}
}

// A lock key or value that no store would accept in a fence is refused
// before anything is sent: no token is issued and no record written, even
// while the foreign lock holds exactly that value.
func TestFenceLockRefusesFencesNoStoreAccepts(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	prefix := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(prefix))
	ctx := context.Background()
	h := &testenv.Commands{}
	for _, tc := range []struct{ key, value string }{
		{prefix + "bad\xff", "v"},
		{prefix + "k", "v\x00alue"},
	} {
		if err := c.Set(ctx, tc.key, tc.value, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		c.AddHook(h)
		f, err := l.FenceLock(ctx, tc.key, tc.value)
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("FenceLock(%q, %q) = %v, %v; want an error matching fence.ErrInvalid", tc.key, tc.value, f, err)
		}
		if _, err := l.FenceLockAbove(ctx, tc.key, tc.value, 5); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("FenceLockAbove(%q, %q) = %v, want ErrInvalid", tc.key, tc.value, err)
		}
		if n := h.Len(); n != 0 {
			t.Errorf("FenceLock(%q, %q) sent %d commands", tc.key, tc.value, n)
		}
		c = redis.NewClient(opt) // without the hook
		defer c.Close()
		if n := c.Exists(ctx, fenceKey(l, tc.key)).Val(); n != 0 {
			t.Errorf("FenceLock(%q, %q) wrote its fence record", tc.key, tc.value)
		}
		_ = c.Del(ctx, tc.key)
	}
}

// awkwardKeys are lock keys whose braces make Redis Cluster hash something
// other than the obvious.
var awkwardKeys = []string{
	"orders", "{orders}", "{user:1}:lock", "x{user:1}", "a{b", "a}b", "{}x", "}{",
	"x{}{y}", "{{a}}", "a{b{c}d", "}", "{", "{}", "}}{{", "foo{}{bar}", "ünïcode}",
	"{a}", "a", "{a}b", "{{a}", "lock}{", "sp ace{}",
}

func TestFenceKeySlot(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartRedisCluster(t)
	node := srv.Client()
	l, err := lock.New(srv.ClusterClient())
	if err != nil {
		t.Fatal(err)
	}
	keys := append([]string(nil), awkwardKeys...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = "ab{}"[rng.IntN(4)]
		}
		keys = append(keys, string(b), "}"+strconv.FormatUint(rng.Uint64(), 36))
	}
	lockSlots := make([]*redis.IntCmd, len(keys))
	fenceSlots := make([]*redis.IntCmd, len(keys))
	seen := make(map[string]string, len(keys))
	pipe := node.Pipeline()
	for i, k := range keys {
		fk := fenceKey(l, k)
		if other, ok := seen[fk]; ok && other != k {
			t.Fatalf("lock keys %q and %q share fence record %q", k, other, fk)
		}
		seen[fk] = k
		lockSlots[i] = pipe.ClusterKeySlot(ctx, k)
		fenceSlots[i] = pipe.ClusterKeySlot(ctx, fk)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if a, b := lockSlots[i].Val(), fenceSlots[i].Val(); a != b {
			t.Fatalf("lock key %q in slot %d, its fence record %q in slot %d", k, a, fenceKey(l, k), b)
		}
	}
}

func TestFenceLockOnCluster(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartRedisCluster(t)
	cc := srv.ClusterClient()
	l, err := lock.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range awkwardKeys {
		// The foreign lock: SET NX PX with a value of its own, as redsync
		// and redislock take theirs.
		if ok, err := cc.SetNX(ctx, k, "grant-of-"+k, time.Minute).Result(); err != nil || !ok {
			t.Fatalf("SET NX %q: %v %v", k, ok, err)
		}
		// A script over two slots would fail with CROSSSLOT here.
		if f := mustFence(t, l, k, "grant-of-"+k); f.Token < 1 {
			t.Fatalf("%q: first token %d", k, f.Token)
		}
		if _, err := l.FenceLockAbove(ctx, k, "grant-of-"+k, 7); err != nil {
			t.Fatalf("FenceLockAbove(%q): %v", k, err)
		}
		if err := cc.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFenceLockOneCommand(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	p := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(p))
	c.Set(ctx, p+"warm", "v", time.Minute)
	mustFence(t, l, p+"warm", "v") // loads the script
	c.Set(ctx, p+"k", "v1", time.Minute)
	h := &testenv.Commands{}
	c.AddHook(h)
	mustFence(t, l, p+"k", "v1") // a new grant
	mustFence(t, l, p+"k", "v1") // a repeat
	if n := h.Len(); n != 2 {
		t.Fatalf("two FenceLock calls sent %d commands, want 2", n)
	}
}

// BenchmarkFenceLockRepeat is FenceLock within one grant: one script that
// reads and keeps the record as long as the lease.
func BenchmarkFenceLockRepeat(b *testing.B) {
	ctx := context.Background()
	c := testenv.Redis(b)
	p := testenv.Prefix(b)
	l, err := lock.New(c, lock.WithPrefix(p))
	if err != nil {
		b.Fatal(err)
	}
	c.Set(ctx, p+"k", "v", time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.FenceLock(ctx, p+"k", "v"); err != nil {
			b.Fatal(err)
		}
	}
}

// The fence record follows the foreign lock's lease as of each FenceLock
// call: a call after the lock was extended keeps the grant's token past
// the record's first expiry; a grant extended without another call
// outlives its record, and its next call gets a new, higher token, as the
// doc says.
func TestFenceRecordFollowsTheLeaseAtEachCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	l := newLocker(t, c, lock.WithPrefix(prefix), lock.WithTokenRetention(100*time.Millisecond))
	key := prefix + "long-held"
	if err := c.Set(ctx, key, "v", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	first := mustFence(t, l, key, "v")
	if err := c.PExpire(ctx, key, 3*time.Second).Err(); err != nil { // the library extends
		t.Fatal(err)
	}
	if f := mustFence(t, l, key, "v"); f != first {
		t.Fatalf("after the extension FenceLock = %v, want %v", f, first)
	}
	rec, lk := c.PTTL(ctx, fenceKey(l, key)).Val(), c.PTTL(ctx, key).Val()
	if rec < lk {
		t.Fatalf("fence record PTTL %v below the extended lock's %v", rec, lk)
	}
	time.Sleep(500 * time.Millisecond) // past the record's first expiry (400ms)
	if f := mustFence(t, l, key, "v"); f != first {
		t.Fatalf("later FenceLock = %v, want %v", f, first)
	}
	// Extended again, with no call: the record runs out before the lock.
	if err := c.PExpire(ctx, key, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fence record did not expire", keyGone(c, fenceKey(l, key)))
	if f := mustFence(t, l, key, "v"); f.Token <= first.Token {
		t.Fatalf("after the record expired FenceLock = %v, want a token above %d", f, first.Token)
	}
}
