package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// newStore returns a store on the shared Redis under a prefix unique to t,
// and a plain client of the same server.
func newStore(t testing.TB, opts ...Option) (*Store, *goredis.Client) {
	t.Helper()
	c := testenv.Redis(t)
	s, err := New(c, append([]Option{WithPrefix(testenv.Prefix(t))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, c
}

// noRetryClient returns a client of the shared Redis that never retries a
// command: its retry horizon is zero, so a store on it accepts any retry
// window from MinRetryWindow.
func noRetryClient(t testing.TB) *goredis.Client {
	t.Helper()
	opt, err := goredis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := goredis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newShortStore is newStore on a client that never retries, for stores with
// a short retry window.
func newShortStore(t testing.TB, opts ...Option) (*Store, *goredis.Client) {
	t.Helper()
	c := noRetryClient(t)
	s, err := New(c, append([]Option{WithPrefix(testenv.Prefix(t))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, c
}

// recordKeys returns the retry records of the store's calls on key.
func recordKeys(t testing.TB, c *goredis.Client, s *Store, key string) []string {
	t.Helper()
	pattern := `\{` + slotTag(s.redisKey(key)) + `\}` + s.storeID + "*"
	keys, err := scanAll(c, pattern)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func scanAll(c *goredis.Client, pattern string) ([]string, error) {
	ctx := context.Background()
	var keys []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys, iter.Err()
}

func fen(token fence.Token, holder string) fence.Fence {
	return fence.Fence{Resource: "account", Token: token, Holder: holder}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawState is everything Redis holds for a key: its hash fields, or its DUMP
// for other types, and its remaining lifetime.
func rawState(t *testing.T, c *goredis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	dump, err := c.Dump(ctx, key).Result()
	if err != nil && err != goredis.Nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if ttl > 0 {
		ttl = 1 // present; the exact remainder moves on by itself
	}
	return dump + "|" + ttl.String()
}
