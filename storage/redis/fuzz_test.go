package redis

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// FuzzOptions: New and WithTTL accept exactly the options their docs
// describe, every refusal matches errInvalidOption, an empty key is
// refused with errInvalidKey, and nothing refused sends a command.
func FuzzOptions(f *testing.F) {
	f.Add("p:", int64(0), int64(time.Minute), int64(time.Second), "k")
	f.Add("", int64(-1), int64(time.Second-1), int64(time.Millisecond-1), "")
	f.Add("{p}", int64(time.Millisecond), int64(time.Second), int64(MaxDuration+1), "k")
	f.Add("p", int64(time.Hour), int64(2*time.Hour), int64(1), "{k}")
	f.Add("p", int64(MaxDuration), int64(MaxRetryWindow), int64(MaxDuration), "k")
	hook := &testenv.Commands{}
	// Nothing listens there: a call that sends fails, and the hook sees it.
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	c.AddHook(hook)
	f.Cleanup(func() { _ = c.Close() })
	f.Fuzz(func(t *testing.T, prefix string, retention, window, ttl int64, key string) {
		s, err := New(c, WithPrefix(prefix), WithMarkRetention(time.Duration(retention)), WithRetryWindow(time.Duration(window)))
		r, w := time.Duration(retention), time.Duration(window)
		want := prefix != "" && !strings.ContainsAny(prefix, "{}") &&
			(r == 0 || r >= time.Millisecond && r <= MaxDuration) &&
			w >= time.Second && w <= MaxRetryWindow &&
			(r == 0 || r >= w)
		if (err == nil) != want {
			t.Fatalf("New(prefix %q, retention %v, window %v) = %v, want accepted=%v", prefix, r, w, err, want)
		}
		if err != nil && !errors.Is(err, errInvalidOption) {
			t.Fatalf("New refused with %v, not errInvalidOption", err)
		}
		if s == nil {
			s, _ = New(c)
		}
		d := time.Duration(ttl)
		badTTL := d < time.Millisecond || d > MaxDuration
		if !badTTL && key != "" {
			return // a valid call would be sent
		}
		_, err = s.CompareAndSet(context.Background(), key, 0, []byte("v"), WithTTL(d))
		switch {
		case badTTL:
			if !errors.Is(err, errInvalidOption) {
				t.Fatalf("WithTTL(%v): %v, want errInvalidOption", d, err)
			}
		default:
			if !errors.Is(err, errInvalidKey) {
				t.Fatalf("empty key: %v, want errInvalidKey", err)
			}
		}
		if sent := hook.Take(); len(sent) > 0 {
			t.Fatalf("a refused call sent %v", sent)
		}
	})
}

// FuzzStoreRoundTrip: random bytes as keys, values, resources and holders
// go through every Store call against the real server; each call succeeds
// or returns a documented error, and what is read back is exactly what was
// written: the value's bytes, its version and the key's mark.
func FuzzStoreRoundTrip(f *testing.F) {
	f.Add("k", []byte("v"), "account", "h", int64(7))
	f.Add("", []byte{}, "", "", int64(0))
	f.Add("{user42}:cart", []byte{0, 0xff, '\n', ' '}, "r\x00", "h", int64(1))
	f.Add("k k\x00\xff", []byte("ÿ\x00"), "ünï", "\xc3", int64(-1))
	f.Add("k", bytes.Repeat([]byte("x"), 5000), strings.Repeat("r", 1025), "h h", int64(1<<62))
	f.Add("\x00", []byte(nil), "r", "0123456789abcdef0123456789abcdef", int64(9007199254740993))
	// Resources as long as they may be, so the one that differs must not be longer.
	f.Add("k", []byte("v"), strings.Repeat("r", fence.MaxResourceLen), "h", int64(3))
	f.Add("k", []byte("v"), strings.Repeat("r", fence.MaxResourceLen-2)+"é", "h", int64(3))
	c := testenv.Redis(f)
	base := testenv.Prefix(f)
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, key string, data []byte, resource, holder string, token int64) {
		prefix := base + strconv.FormatInt(seq.Add(1), 10) + ":"
		s, err := New(c, WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Del(context.Background(), prefix+key)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f1 := fence.Fence{Resource: resource, Token: fence.Token(token), Holder: holder}

		v1, err := s.FencedSet(ctx, f1, key, data)
		switch {
		case key == "":
			if !errors.Is(err, errInvalidKey) {
				t.Fatalf("Set with an empty key: %v", err)
			}
			return
		case f1.Validate() != nil:
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("Set with invalid fence %v: %v", f1, err)
			}
			if n, _ := c.Exists(ctx, prefix+key).Result(); n != 0 {
				t.Fatalf("Set with invalid fence %v wrote the key", f1)
			}
			return
		case err != nil:
			t.Fatalf("Set(%v, %q, %q): %v", f1, key, data, err)
		}
		want := func(op string, data []byte, version int64, mark fence.Fence) {
			t.Helper()
			v, err := s.Load(ctx, key)
			if err != nil || !bytes.Equal(v.Data, data) || v.Version != version || !v.Exists {
				t.Fatalf("after %s: Load = %q version %d exists %v, %v; want %q version %d", op, v.Data, v.Version, v.Exists, err, data, version)
			}
			hw, err := s.HighWater(ctx, key)
			if err != nil || hw != mark {
				t.Fatalf("after %s: mark %v, %v; want %v", op, hw, err, mark)
			}
		}
		want("Set", data, v1, f1)
		if v1 != 1 {
			t.Fatalf("first Set: version %d", v1)
		}
		if got, err := s.FencedGet(ctx, f1, key); err != nil || !bytes.Equal(got.Data, data) {
			t.Fatalf("Get: %q, %v", got.Data, err)
		}
		if token > 1 {
			stale := fence.Fence{Resource: resource, Token: fence.Token(token - 1), Holder: holder + "x"}
			if _, err := s.FencedSet(ctx, stale, key, []byte("stale")); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("stale Set: %v", err)
			} else if hw, ok := fence.LostTo(err); !ok || hw != f1 {
				t.Fatalf("stale Set: mark %v in %v, want %v", hw, err, f1)
			}
			want("a stale Set", data, 1, f1)
		}
		other := fence.Fence{Resource: otherResource(resource), Token: fence.Token(token), Holder: holder}
		if _, err := s.FencedSet(ctx, other, key, []byte("other")); !errors.Is(err, ErrResourceMismatch) {
			t.Fatalf("Set for another resource: %v", err)
		}
		rev := slices.Clone(data)
		slices.Reverse(rev)
		v2, err := s.CompareAndSet(ctx, key, 1, rev)
		if err != nil || v2 != 2 {
			t.Fatalf("CompareAndSet: %d, %v", v2, err)
		}
		want("CompareAndSet", rev, 2, f1)
		if _, err := s.CompareAndSet(ctx, key, 1, data); !errors.Is(err, fence.ErrConflict) {
			t.Fatalf("CompareAndSet at an old version: %v", err)
		}
		v3, err := s.FencedSetIfVersion(ctx, f1, key, 2, data, WithTTL(time.Hour))
		if err != nil || v3 != 3 {
			t.Fatalf("SetIfVersion: %d, %v", v3, err)
		}
		want("SetIfVersion", data, 3, f1)
		f2 := f1
		if token < 1<<62 {
			f2 = fence.Fence{Resource: resource, Token: fence.Token(token + 1), Holder: holder + "2"}
		}
		up, err := s.FencedUpdate(ctx, f2, key, func(old Value) ([]byte, error) {
			if !bytes.Equal(old.Data, data) {
				t.Errorf("Update read %q, want %q", old.Data, data)
			}
			return append(slices.Clone(old.Data), data...), nil
		})
		doubled := append(slices.Clone(data), data...)
		if err != nil || up.Version != 4 || !bytes.Equal(up.Data, doubled) {
			t.Fatalf("Update: %q version %d, %v", up.Data, up.Version, err)
		}
		want("Update", doubled, 4, f2)
		mod, err := s.Modify(ctx, key, 3, func(old Value) ([]byte, error) { return old.Data[:len(old.Data)/2], nil })
		if err != nil || mod.Version != 5 || !bytes.Equal(mod.Data, data) {
			t.Fatalf("Modify: %q version %d, %v", mod.Data, mod.Version, err)
		}
		want("Modify", data, 5, f2)
		if v, err := s.CompareAndDelete(ctx, key, 5); err != nil || v != 6 {
			t.Fatalf("CompareAndDelete: %d, %v", v, err)
		}
		if v, err := s.Load(ctx, key); !errors.Is(err, fence.ErrNotFound) || v.Version != 6 {
			t.Fatalf("Load after CompareAndDelete: version %d, %v", v.Version, err)
		}
		if _, err := s.FencedSet(ctx, f2, key, rev); err != nil {
			t.Fatalf("Set after a delete: %v", err)
		}
		want("Set after a delete", rev, 7, f2)
		if err := s.FencedDelete(ctx, f2, key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.FencedGet(ctx, f2, key); !errors.Is(err, fence.ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		if hw, err := s.HighWater(ctx, key); err != nil || hw != f2 {
			t.Fatalf("mark after Delete: %v, %v; want %v", hw, err, f2)
		}
	})
}

// otherResource returns a valid resource other than the valid resource r:
// r with "x" added, or, when r is already as long as a resource may be,
// with its last character replaced.
func otherResource(r string) string {
	if len(r) < fence.MaxResourceLen {
		return r + "x"
	}
	last, size := utf8.DecodeLastRuneInString(r)
	if last == 'x' {
		return r[:len(r)-size] + "y"
	}
	return r[:len(r)-size] + "x"
}
