package redis

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

// TestCluster runs the operations against real Redis Clusters, one node and
// three masters with a replica each, which check every script's keys for
// cross-slot access, and checks that a caller's hash tag decides the slot
// of the stored key.
func TestCluster(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) *redis.ClusterClient
	}{
		{"one node", func(t *testing.T) *redis.ClusterClient { return testenv.StartRedisCluster(t).ClusterClient() }},
		{"three masters with replicas", func(t *testing.T) *redis.ClusterClient { return testenv.StartCluster(t, 3, 1).Client() }},
	} {
		t.Run(tc.name, func(t *testing.T) { clusterOps(t, tc.client(t)) })
	}
}

func clusterOps(t *testing.T, cc *redis.ClusterClient) {
	s, err := New(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	key := "{user42}:cart"
	want, err := cc.ClusterKeySlot(ctx, "{user42}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := cc.ClusterKeySlot(ctx, s.Prefix()+key).Val(); got != want {
		t.Fatalf("stored key in slot %d, want the caller's tag slot %d", got, want)
	}
	if _, err := s.FencedGet(ctx, fen(1, "a"), key); !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, fen(1, "a"), key, []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedUpdate(ctx, fen(2, "b"), key, func(old Value) ([]byte, error) { return append(old.Data, '+'), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, fen(1, "a"), key, []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale write on the cluster: %v", err)
	}
	if _, err := s.CompareAndSet(ctx, key, 2, []byte("cas")); err != nil {
		t.Fatal(err)
	}
	if err := s.FencedDelete(ctx, fen(2, "b"), key); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Load(ctx, key); !errors.Is(err, fence.ErrNotFound) || v.Version != 4 {
		t.Fatalf("Load after delete = %+v, %v; want ErrNotFound at version 4", v, err)
	}
	if hw, err := s.HighWater(ctx, key); err != nil || hw != fen(2, "b") {
		t.Fatalf("mark = %v, %v; want %v", hw, err, fen(2, "b"))
	}
	// Every call's record lies in its value's slot, whatever braces the
	// caller's key holds: the cluster refuses a script whose keys do not.
	for _, k := range []string{"plain", "a}b", "x{}y", "{}", "{{t}}", "open{", "}{", "{tag}rest"} {
		if _, err := s.FencedSet(ctx, fen(1, "a"), k, []byte("v")); err != nil {
			t.Fatalf("Set %q: %v", k, err)
		}
		if _, err := s.CompareAndSet(ctx, k, 1, []byte("w")); err != nil {
			t.Fatalf("CompareAndSet %q: %v", k, err)
		}
		vkey := s.redisKey(k)
		want := cc.ClusterKeySlot(ctx, vkey).Val()
		if got := cc.ClusterKeySlot(ctx, recordKey(vkey, "fkr:x:1")).Val(); got != want || int64(keyslot.Of(vkey)) != want {
			t.Fatalf("key %q: record in slot %d, value in %d (computed %d)", k, got, want, keyslot.Of(vkey))
		}
	}
}
