// Package redisstoresuite is the test suite that storage/redis's Store
// must pass on every Redis client library it runs on: storage/redis's own
// tests run it through go-redis, lock/rueidisfence's through rueidis (a
// single server and a Cluster). It checks the main behaviours against a
// real server: fenced reads, writes and deletes, stale and foreign fences
// refused, version-checked writes, keys of another kind, and input refused
// before anything is sent.
package redisstoresuite

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// Target is one client library's way to a Redis deployment.
type Target struct {
	// Open returns a store on the deployment made with opts (a key prefix
	// of the test's own among them), and a go-redis client of the same
	// deployment for what a test writes or reads beside the store.
	Open func(t *testing.T, opts ...fkredis.Option) (*fkredis.Store, redis.UniversalClient)
}

// Run runs every test of the suite on tg.
func Run(t *testing.T, tg Target) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t, tg)) })
	}
}

var tests = []struct {
	name string
	fn   func(t *testing.T, e env)
}{
	{"FencedSetGetDelete", fencedSetGetDelete},
	{"StaleAndForeignFencesRefused", staleRefused},
	{"CompareAndSet", compareAndSet},
	{"WrongTypedKey", wrongTyped},
	{"BadInputSendsNothing", badInput},
}

// env is one test's store, under a prefix of its own.
type env struct {
	ctx context.Context
	s   *fkredis.Store
	raw redis.UniversalClient
}

func open(t *testing.T, tg Target) env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	s, raw := tg.Open(t, fkredis.WithPrefix(testenv.Prefix(t)+"store-"))
	if err := s.Preload(ctx); err != nil {
		t.Fatalf("Preload: %v", err)
	}
	return env{ctx: ctx, s: s, raw: raw}
}

func fen(token fence.Token, holder string) fence.Fence {
	return fence.Fence{Resource: "account", Token: token, Holder: holder}
}

// fencedSetGetDelete: a fenced read of a missing value raises the mark and
// reports version 0; a write stores the value at the next version; a
// delete removes it and keeps the mark.
func fencedSetGetDelete(t *testing.T, e env) {
	a := fen(1, "a")
	if v, err := e.s.FencedGet(e.ctx, a, "{u1}:k"); !errors.Is(err, fence.ErrNotFound) || v.Version != 0 || v.Exists {
		t.Fatalf("FencedGet of a missing key = %+v, %v; want ErrNotFound at version 0", v, err)
	}
	if hw, err := e.s.HighWater(e.ctx, "{u1}:k"); err != nil || hw != a {
		t.Fatalf("mark after a fenced read = %v, %v; want %v", hw, err, a)
	}
	if ver, err := e.s.FencedSet(e.ctx, a, "{u1}:k", []byte("one\x00two")); err != nil || ver != 1 {
		t.Fatalf("FencedSet = %d, %v; want 1", ver, err)
	}
	v, err := e.s.FencedGet(e.ctx, a, "{u1}:k")
	if err != nil || string(v.Data) != "one\x00two" || v.Version != 1 || !v.Exists || !v.ExpiresAt.IsZero() {
		t.Fatalf("FencedGet = %+v, %v; want the bytes written at version 1", v, err)
	}
	if ver, err := e.s.FencedSet(e.ctx, a, "{u1}:k", []byte("short"), fkredis.WithTTL(time.Hour)); err != nil || ver != 2 {
		t.Fatalf("FencedSet with a TTL = %d, %v; want 2", ver, err)
	}
	if v, err := e.s.Load(e.ctx, "{u1}:k"); err != nil || string(v.Data) != "short" || v.ExpiresAt.IsZero() {
		t.Fatalf("Load = %+v, %v; want the value with an expiry", v, err)
	}
	if err := e.s.FencedDelete(e.ctx, a, "{u1}:k"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.s.FencedGet(e.ctx, a, "{u1}:k"); !errors.Is(err, fence.ErrNotFound) || v.Version != 3 {
		t.Fatalf("FencedGet after the delete = %+v, %v; want ErrNotFound at version 3", v, err)
	}
	got, err := e.s.FencedUpdate(e.ctx, fen(2, "b"), "{u1}:k", func(old fkredis.Value) ([]byte, error) {
		return append(old.Data, '+'), nil
	})
	if err != nil || string(got.Data) != "+" || got.Version != 4 {
		t.Fatalf("FencedUpdate = %+v, %v; want + at version 4", got, err)
	}
}

// staleRefused: an older token, or the mark's token with another holder,
// is refused with the mark and changes nothing, reads included; a fence of
// another resource is refused as foreign.
func staleRefused(t *testing.T, e env) {
	newer, older := fen(5, "new"), fen(3, "old")
	if _, err := e.s.FencedSet(e.ctx, newer, "k", []byte("new")); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func(f fence.Fence) error{
		"FencedSet":    func(f fence.Fence) error { _, err := e.s.FencedSet(e.ctx, f, "k", []byte("late")); return err },
		"FencedGet":    func(f fence.Fence) error { _, err := e.s.FencedGet(e.ctx, f, "k"); return err },
		"FencedDelete": func(f fence.Fence) error { return e.s.FencedDelete(e.ctx, f, "k") },
	} {
		for _, f := range []fence.Fence{older, fen(5, "other")} {
			err := call(f)
			var se *fence.StaleError
			if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.HighWater != newer {
				t.Errorf("%s with %v after %v = %v; want a StaleError carrying the mark", name, f, newer, err)
			}
		}
		err := call(fence.Fence{Resource: "other", Token: 9, Holder: "x"})
		var re *fkredis.ResourceError
		if !errors.Is(err, fkredis.ErrResourceMismatch) || !errors.As(err, &re) || re.Resource != "account" {
			t.Errorf("%s with another resource's fence = %v; want a ResourceError naming account", name, err)
		}
	}
	if v, err := e.s.Load(e.ctx, "k"); err != nil || string(v.Data) != "new" || v.Version != 1 {
		t.Fatalf("value after the refusals = %+v, %v; want new at version 1", v, err)
	}
}

// compareAndSet: writes and deletes at the expected version only; a
// mismatch is a conflict carrying the version found and changes nothing.
func compareAndSet(t *testing.T, e env) {
	if ver, err := e.s.CompareAndSet(e.ctx, "c", 0, []byte("a")); err != nil || ver != 1 {
		t.Fatalf("CompareAndSet at 0 = %d, %v; want 1", ver, err)
	}
	_, err := e.s.CompareAndSet(e.ctx, "c", 0, []byte("b"))
	var ce *fence.ConflictError
	if !errors.Is(err, fence.ErrConflict) || !errors.As(err, &ce) || ce.Actual != 1 {
		t.Fatalf("CompareAndSet at a stale version = %v; want a conflict at version 1", err)
	}
	if _, err := e.s.FencedSetIfVersion(e.ctx, fen(1, "a"), "c", 7, []byte("x")); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("FencedSetIfVersion at a version the key never had = %v; want a conflict", err)
	}
	if ver, err := e.s.CompareAndDelete(e.ctx, "c", 1); err != nil || ver != 2 {
		t.Fatalf("CompareAndDelete at 1 = %d, %v; want 2", ver, err)
	}
	if v, err := e.s.Load(e.ctx, "c"); !errors.Is(err, fence.ErrNotFound) || v.Version != 2 {
		t.Fatalf("Load after the delete = %+v, %v; want ErrNotFound at version 2", v, err)
	}
	v, err := e.s.Modify(e.ctx, "c", 3, func(old fkredis.Value) ([]byte, error) { return []byte("m"), nil })
	if err != nil || v.Version != 3 {
		t.Fatalf("Modify = %+v, %v; want version 3", v, err)
	}
	if hw, err := e.s.HighWater(e.ctx, "c"); err != nil || hw != (fence.Fence{}) {
		t.Fatalf("mark after version-checked writes only = %v, %v; want none", hw, err)
	}
}

// wrongTyped: a key of another type, or a hash the store did not write,
// is refused by every call, named, and left as it was.
func wrongTyped(t *testing.T, e env) {
	str, hash := e.s.Prefix()+"str", e.s.Prefix()+"hash"
	if err := e.raw.Set(e.ctx, str, "plain", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.raw.HSet(e.ctx, hash, "name", "someone").Err(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"str", "hash"} {
		for name, call := range map[string]func() error{
			"FencedGet":     func() error { _, err := e.s.FencedGet(e.ctx, fen(1, "a"), key); return err },
			"FencedSet":     func() error { _, err := e.s.FencedSet(e.ctx, fen(1, "a"), key, []byte("v")); return err },
			"FencedDelete":  func() error { return e.s.FencedDelete(e.ctx, fen(1, "a"), key) },
			"Load":          func() error { _, err := e.s.Load(e.ctx, key); return err },
			"CompareAndSet": func() error { _, err := e.s.CompareAndSet(e.ctx, key, 0, []byte("v")); return err },
		} {
			if err := call(); !errors.Is(err, fence.ErrWrongType) || !strings.Contains(err.Error(), key) {
				t.Errorf("%s on %s = %v; want fence.ErrWrongType naming the key", name, key, err)
			}
		}
	}
	if v, err := e.raw.Get(e.ctx, str).Result(); err != nil || v != "plain" {
		t.Errorf("the string key holds %q, %v after the refusals", v, err)
	}
	if m, err := e.raw.HGetAll(e.ctx, hash).Result(); err != nil || len(m) != 1 || m["name"] != "someone" {
		t.Errorf("the hash holds %v, %v after the refusals", m, err)
	}
}

// badInput: invalid keys, fences, versions, options and contexts are
// refused with fence.ErrInvalid (or the context's error) before anything
// is sent.
func badInput(t *testing.T, e env) {
	var nilCtx context.Context
	ended, cancel := context.WithCancel(e.ctx)
	cancel()
	for name, call := range map[string]func() error{
		"empty key":        func() error { _, err := e.s.FencedSet(e.ctx, fen(1, "a"), "", []byte("v")); return err },
		"token 0":          func() error { _, err := e.s.FencedSet(e.ctx, fen(0, "a"), "k", []byte("v")); return err },
		"no holder":        func() error { _, err := e.s.FencedGet(e.ctx, fen(1, ""), "k"); return err },
		"negative version": func() error { _, err := e.s.CompareAndSet(e.ctx, "k", -1, []byte("v")); return err },
		"TTL below 1ms": func() error {
			_, err := e.s.FencedSet(e.ctx, fen(1, "a"), "k", []byte("v"), fkredis.WithTTL(time.Microsecond))
			return err
		},
		"nil function": func() error { _, err := e.s.Modify(e.ctx, "k", 1, nil); return err },
		"nil context":  func() error { _, err := e.s.Load(nilCtx, "k"); return err },
	} {
		if err := call(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v; want fence.ErrInvalid", name, err)
		}
	}
	if _, err := e.s.FencedSet(ended, fen(1, "a"), "k", []byte("v")); !errors.Is(err, context.Canceled) {
		t.Errorf("a call with an ended context = %v; want context.Canceled", err)
	}
	if n, err := e.raw.Exists(e.ctx, e.s.Prefix()+"k").Result(); err != nil || n != 0 {
		t.Errorf("refused calls left %d keys, %v", n, err)
	}
}
