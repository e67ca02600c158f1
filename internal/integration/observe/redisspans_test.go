package observe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// redisSpans runs calls on a Redis store that reports to the global
// providers and returns the spans they ended: those whose fencekit.key is
// one of keys.
func redisSpans(t *testing.T, keys []string, calls func(ctx context.Context, s *fkredis.Store)) []sdktrace.ReadOnlySpan {
	t.Helper()
	s, err := fkredis.New(testenv.Redis(t), fkredis.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	seen := len(spans.Ended())
	calls(context.Background(), s)
	var out []sdktrace.ReadOnlySpan
	for _, sp := range spans.Ended()[seen:] {
		if !strings.HasPrefix(sp.Name(), "fencekit.redis.") {
			continue
		}
		for _, kv := range sp.Attributes() {
			for _, k := range keys {
				if kv.Key == "fencekit.key" && strings.HasPrefix(kv.Value.AsString(), k) {
					out = append(out, sp)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no spans recorded")
	}
	return out
}

// spanStrings returns every string a span exports: its name, string
// attributes, status description, and its events' names and string
// attributes.
func spanStrings(sp sdktrace.ReadOnlySpan) []string {
	out := []string{sp.Name(), sp.Status().Description}
	attrs := func(kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			out = append(out, string(kv.Key), kv.Value.String())
		}
	}
	attrs(sp.Attributes())
	for _, ev := range sp.Events() {
		out = append(out, ev.Name)
		attrs(ev.Attributes)
	}
	return out
}

// TestRedisSpansNameNoHolder runs every refusal of the Redis store with
// holder ids as secret as a lock's (a FenceLock's holder is the foreign
// lock's value, which releases it) and checks that no span attribute, event
// or status names either holder.
func TestRedisSpansNameNoHolder(t *testing.T) {
	older := fence.Fence{Resource: "acct", Token: 5, Holder: fence.NewHolder()}
	newer := fence.Fence{Resource: "acct", Token: 6, Holder: fence.NewHolder()}
	other := fence.Fence{Resource: "other", Token: 9, Holder: fence.NewHolder()}
	got := redisSpans(t, []string{"k"}, func(ctx context.Context, s *fkredis.Store) {
		if _, err := s.FencedSet(ctx, newer, "k", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FencedSet(ctx, older, "k", []byte("y")); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Set = %v", err)
		}
		if _, err := s.FencedGet(ctx, older, "k"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Get = %v", err)
		}
		if err := s.FencedDelete(ctx, older, "k"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Delete = %v", err)
		}
		if _, err := s.FencedUpdate(ctx, older, "k", func(fkredis.Value) ([]byte, error) { return nil, nil }); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Update = %v", err)
		}
		if _, err := s.FencedSetIfVersion(ctx, newer, "k", 9, []byte("z")); !errors.Is(err, fence.ErrConflict) {
			t.Fatalf("conflicting SetIfVersion = %v", err)
		}
		if _, err := s.FencedSet(ctx, other, "k", []byte("z")); !errors.Is(err, fkredis.ErrResourceMismatch) {
			t.Fatalf("Set for another resource = %v", err)
		}
	})
	refused := 0
	for _, sp := range got {
		if len(sp.Events()) > 0 {
			refused++
		}
		for _, s := range spanStrings(sp) {
			for _, h := range []string{older.Holder, newer.Holder, other.Holder} {
				if strings.Contains(s, h) {
					t.Errorf("span %s carries a holder id in %q", sp.Name(), s)
				}
			}
		}
	}
	if refused < 6 {
		t.Fatalf("%d spans recorded a refusal; want 6", refused)
	}
}

// TestRedisSpanStringsAreUTF8 uses keys that are not valid UTF-8 (Redis
// keys are binary) and checks that every string the spans export is valid
// UTF-8: an OTLP exporter drops a whole batch over one invalid string.
func TestRedisSpanStringsAreUTF8(t *testing.T) {
	f := fence.Fence{Resource: "acct", Token: 5, Holder: "h"}
	got := redisSpans(t, []string{"bin"}, func(ctx context.Context, s *fkredis.Store) {
		if _, err := s.FencedSet(ctx, f, "bin\xff\xfe", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FencedGet(ctx, fence.Fence{Resource: "acct", Token: 4, Holder: "h"}, "bin\xff\xfe"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Get = %v", err)
		}
		if _, err := s.Load(ctx, "bin\xc3"); !errors.Is(err, fence.ErrNotFound) {
			t.Fatalf("Load = %v", err)
		}
	})
	if len(got) != 3 {
		t.Fatalf("%d spans; want 3", len(got))
	}
	for _, sp := range got {
		for _, s := range spanStrings(sp) {
			if !utf8.ValidString(s) {
				t.Errorf("span %s exports %q, not valid UTF-8", sp.Name(), s)
			}
		}
	}
}
