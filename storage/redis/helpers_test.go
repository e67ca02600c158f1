package redis

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
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

func fen(token fence.Token, holder string) fence.Fence {
	return fence.Fence{Resource: "account", Token: token, Holder: holder}
}

// counter is a go-redis hook that records every command a client sends.
type counter struct {
	mu   sync.Mutex
	cmds []string
}

func (h *counter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *counter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.mu.Lock()
		h.cmds = append(h.cmds, strings.ToLower(cmd.Name()))
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *counter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.mu.Lock()
		for _, cmd := range cmds {
			h.cmds = append(h.cmds, strings.ToLower(cmd.Name()))
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// take returns the commands recorded since the last call and forgets them.
func (h *counter) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.cmds
	h.cmds = nil
	return out
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
