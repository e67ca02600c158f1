package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// newTestRing returns a Ring over the given shard addresses that marks a
// shard down quickly: a heartbeat every 50 ms, each failing after 100 ms.
func newTestRing(t *testing.T, addrs map[string]string) *goredis.Ring {
	t.Helper()
	ring := goredis.NewRing(&goredis.RingOptions{
		Addrs: addrs, HeartbeatFrequency: 50 * time.Millisecond,
		DialTimeout: 100 * time.Millisecond, DialerRetries: 1,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
		MaxRetries: -1,
	})
	t.Cleanup(func() { _ = ring.Close() })
	return ring
}

// shardOf returns the address of the shard the ring sends key to now.
func shardOf(t *testing.T, ring *goredis.Ring, key string) string {
	t.Helper()
	c, err := ring.GetShardClientForKey(key)
	if err != nil {
		t.Fatalf("shard for %q: %v", key, err)
	}
	return c.Options().Addr
}

// TestRingAdmitsStaleFence is the negative control for the refusal of a
// Ring: the store's own script, run through a Ring, admits a token-3 write
// after a token-5 holder's write was acknowledged, once the Ring has marked
// the first shard down and sent the key to the other. No data is lost on the
// way: when the first shard is back, it still holds the token-5 value, and
// the other shard holds the stale one.
func TestRingAdmitsStaleFence(t *testing.T) {
	t.Parallel()
	a, b := testenv.StartRedis(t), testenv.StartRedis(t)
	pa := testenv.StartProxy(t, a.Addr()) // shard a is reached through a network the test can cut
	ring := newTestRing(t, map[string]string{"a": pa.Addr(), "b": b.Addr()})
	ctx := context.Background()

	// The store as New would make it if it accepted the Ring: New refuses
	// it, so the store is made on a plain client and pointed at the Ring.
	s, err := New(a.Client())
	if err != nil {
		t.Fatal(err)
	}
	s.client = newGoRedis(ring)
	key := ""
	for i := 0; key == ""; i++ {
		if k := "k" + strconv.Itoa(i); shardOf(t, ring, s.redisKey(k)) == pa.Addr() {
			key = k
		}
	}
	newer, older := fence.Fence{Resource: "r", Token: 5, Holder: "new"}, fence.Fence{Resource: "r", Token: 3, Holder: "old"}
	if _, err := s.FencedSet(ctx, newer, key, []byte("token 5")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, older, key, []byte("token 3")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("token 3 after token 5, shard up: %v; want ErrStale", err)
	}

	pa.Block()
	eventually(t, 10*time.Second, "the ring marks shard a down", func() bool {
		return shardOf(t, ring, s.redisKey(key)) == b.Addr()
	})
	if _, err := s.FencedSet(ctx, older, key, []byte("token 3")); err != nil {
		t.Fatalf("token 3 after token 5, key moved to shard b: %v; the Ring hazard did not show", err)
	}
	t.Log("a token-3 write was admitted after a token-5 write: shard b holds no mark for the key")

	pa.Unblock()
	eventually(t, 10*time.Second, "the ring marks shard a up", func() bool {
		return shardOf(t, ring, s.redisKey(key)) == pa.Addr()
	})
	if v, err := s.Load(ctx, key); err != nil || string(v.Data) != "token 5" {
		t.Fatalf("shard a after it came back: %q, %v; want the token-5 value kept", v.Data, err)
	}
	if got := b.Client().HGet(ctx, s.redisKey(key), "v").Val(); got != "token 3" {
		t.Fatalf("shard b holds %q; want the stale token-3 value", got)
	}
}

// wrappedScripter is a client of one's own that holds the real client in a
// named field, as a tracing wrapper might.
type wrappedScripter struct {
	inner goredis.Scripter
	goredis.Scripter
}

// TestNewRefusesRing checks that New refuses a Ring however it is passed (as
// itself, as a UniversalClient, inside a wrapper), with an error that
// matches fence.ErrInvalid, says why and names what to use instead.
func TestNewRefusesRing(t *testing.T) {
	t.Parallel()
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}) // New sends nothing
	t.Cleanup(func() { _ = ring.Close() })
	plain := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = plain.Close() })
	var universal goredis.UniversalClient = ring
	refused := map[string]goredis.Scripter{
		"Ring":                       ring,
		"UniversalClient":            universal,
		"wrapper embedding it":       scripter{ring},
		"wrapper holding it":         &wrappedScripter{inner: ring, Scripter: plain},
		"wrapper of a wrapper of it": scripter{&wrappedScripter{Scripter: ring}},
	}
	for name, client := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := New(client)
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("New = %v; want an error matching fence.ErrInvalid", err)
			}
			for _, want := range []string{"storage/redis", "Ring", "marks a shard down", "stale", "*redis.Client", "*redis.ClusterClient"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not say %q", err, want)
				}
			}
		})
	}
	for name, client := range map[string]goredis.Scripter{"Client": plain, "wrapper of a Client": &wrappedScripter{inner: plain, Scripter: plain}} {
		if _, err := New(client); err != nil {
			t.Fatalf("New on a %s: %v", name, err)
		}
	}
}
