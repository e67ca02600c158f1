package redis

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	quick := noRetryClient(t)
	var nilClient *goredis.Client
	tests := []struct {
		name   string
		client goredis.Scripter
		opts   []Option
		want   string
	}{
		{"nil client", nil, nil, "nil Redis client"},
		{"typed nil client", nilClient, nil, "nil Redis client"},
		{"empty prefix", c, []Option{WithPrefix("")}, "empty key prefix"},
		{"open brace in prefix", c, []Option{WithPrefix("app{1:")}, "brace"},
		{"close brace in prefix", c, []Option{WithPrefix("app}:")}, "brace"},
		{"negative retention", c, []Option{WithMarkRetention(-time.Second)}, "negative"},
		{"sub-millisecond retention", c, []Option{WithMarkRetention(time.Microsecond)}, "below one millisecond"},
		{"overflowing retention", c, []Option{WithMarkRetention(math.MaxInt64)}, "longer than"},
		{"retention past MaxDuration", c, []Option{WithMarkRetention(MaxDuration + time.Millisecond)}, "longer than"},
		{"retention shorter than the retry window", c, []Option{WithMarkRetention(30 * time.Second)}, "shorter than the retry window"},
		{"retention shorter than a set retry window", quick, []Option{WithRetryWindow(2 * time.Second), WithMarkRetention(time.Second)}, "shorter than the retry window"},
		{"zero retry window", c, []Option{WithRetryWindow(0)}, "below 1s"},
		{"sub-second retry window", quick, []Option{WithRetryWindow(999 * time.Millisecond)}, "below 1s"},
		{"retry window shorter than the client's retries", c, []Option{WithRetryWindow(time.Minute)}, "shorter than the client's retry horizon"},
		{"overflowing retry window", c, []Option{WithRetryWindow(math.MaxInt64)}, "longer than"},
		{"nil option", c, []Option{nil}, "nil option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.client, tt.opts...)
			if err == nil || s != nil {
				t.Fatalf("New = %v, %v; want an error", s, err)
			}
			if !errors.Is(err, errInvalidOption) || !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error %q does not match errInvalidOption and fence.ErrInvalid or lacks %q", err, tt.want)
			}
		})
	}
	s, err := New(c)
	if err != nil || s.Prefix() != DefaultPrefix {
		t.Fatalf("New with defaults = %v, %v; want prefix %q", s, err, DefaultPrefix)
	}
	for _, b := range []struct {
		client goredis.Scripter
		opts   []Option
	}{
		{c, []Option{WithMarkRetention(MaxDuration)}},
		{c, []Option{WithMarkRetention(DefaultRetryWindow)}},
		{quick, []Option{WithRetryWindow(time.Second), WithMarkRetention(time.Second)}},
		{c, []Option{WithRetryWindow(MaxRetryWindow)}},
	} {
		if _, err := New(b.client, b.opts...); err != nil {
			t.Errorf("New at a bound: %v", err)
		}
	}
}

// TestBadInputSendsNothing checks that invalid calls fail with a clear error
// before any command reaches Redis.
func TestBadInputSendsNothing(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	h := &testenv.Commands{}
	c.AddHook(h)
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	var nilCtx context.Context
	good := fen(1, "a")
	long := fence.Fence{Resource: strings.Repeat("r", fence.MaxResourceLen+1), Token: 1, Holder: "a"}
	inc := func(Value) ([]byte, error) { return []byte("x"), nil }

	tests := []struct {
		name string
		call func() error
		is   error
	}{
		{"get empty key", func() error { _, err := s.FencedGet(ctx, good, ""); return err }, errInvalidKey},
		{"set empty key", func() error { _, err := s.FencedSet(ctx, good, "", nil); return err }, errInvalidKey},
		{"load empty key", func() error { _, err := s.Load(ctx, ""); return err }, errInvalidKey},
		{"cas empty key", func() error { _, err := s.CompareAndSet(ctx, "", 0, nil); return err }, errInvalidKey},
		{"get zero token", func() error { _, err := s.FencedGet(ctx, fen(0, "a"), "k"); return err }, fence.ErrInvalid},
		{"set no holder", func() error { _, err := s.FencedSet(ctx, fen(1, ""), "k", nil); return err }, fence.ErrInvalid},
		{"delete no resource", func() error { return s.FencedDelete(ctx, fence.Fence{Token: 1, Holder: "a"}, "k") }, fence.ErrInvalid},
		{"update negative token", func() error { _, err := s.FencedUpdate(ctx, fen(-1, "a"), "k", inc); return err }, fence.ErrInvalid},
		{"get cancelled", func() error { _, err := s.FencedGet(cancelled, good, "k"); return err }, context.Canceled},
		{"set cancelled", func() error { _, err := s.FencedSet(cancelled, good, "k", nil); return err }, context.Canceled},
		{"delete cancelled", func() error { return s.FencedDelete(cancelled, good, "k") }, context.Canceled},
		{"update cancelled", func() error { _, err := s.FencedUpdate(cancelled, good, "k", inc); return err }, context.Canceled},
		{"load cancelled", func() error { _, err := s.Load(cancelled, "k"); return err }, context.Canceled},
		{"cas cancelled", func() error { _, err := s.CompareAndSet(cancelled, "k", 0, nil); return err }, context.Canceled},
		{"modify cancelled", func() error { _, err := s.Modify(cancelled, "k", 3, inc); return err }, context.Canceled},
		{"preload cancelled", func() error { return s.Preload(cancelled) }, context.Canceled},
		{"get nil context", func() error { _, err := s.FencedGet(nilCtx, good, "k"); return err }, errInvalidOption},
		{"set nil context", func() error { _, err := s.FencedSet(nilCtx, good, "k", nil); return err }, errInvalidOption},
		{"set-if-version nil context", func() error { _, err := s.FencedSetIfVersion(nilCtx, good, "k", 0, nil); return err }, errInvalidOption},
		{"delete nil context", func() error { return s.FencedDelete(nilCtx, good, "k") }, errInvalidOption},
		{"update nil context", func() error { _, err := s.FencedUpdate(nilCtx, good, "k", inc); return err }, errInvalidOption},
		{"load nil context", func() error { _, err := s.Load(nilCtx, "k"); return err }, errInvalidOption},
		{"high-water nil context", func() error { _, err := s.HighWater(nilCtx, "k"); return err }, errInvalidOption},
		{"cas nil context", func() error { _, err := s.CompareAndSet(nilCtx, "k", 0, nil); return err }, errInvalidOption},
		{"cad nil context", func() error { _, err := s.CompareAndDelete(nilCtx, "k", 0); return err }, errInvalidOption},
		{"modify nil context", func() error { _, err := s.Modify(nilCtx, "k", 3, inc); return err }, errInvalidOption},
		{"preload nil context", func() error { return s.Preload(nilCtx) }, errInvalidOption},
		{"get resource too long", func() error { _, err := s.FencedGet(ctx, long, "k"); return err }, fence.ErrInvalid},
		{"set resource too long", func() error { _, err := s.FencedSet(ctx, long, "k", nil); return err }, fence.ErrInvalid},
		{"delete resource too long", func() error { return s.FencedDelete(ctx, long, "k") }, fence.ErrInvalid},
		{"update resource too long", func() error { _, err := s.FencedUpdate(ctx, long, "k", inc); return err }, fence.ErrInvalid},
		{"zero ttl", func() error { _, err := s.FencedSet(ctx, good, "k", nil, WithTTL(0)); return err }, errInvalidOption},
		{"overflowing ttl", func() error { _, err := s.FencedSet(ctx, good, "k", nil, WithTTL(math.MaxInt64)); return err }, errInvalidOption},
		{"ttl past MaxDuration", func() error {
			_, err := s.CompareAndSet(ctx, "k", 0, nil, WithTTL(MaxDuration+time.Millisecond))
			return err
		}, errInvalidOption},
		{"nil write option", func() error { _, err := s.FencedSet(ctx, good, "k", nil, nil); return err }, errInvalidOption},
		{"negative expected version", func() error { _, err := s.CompareAndSet(ctx, "k", -1, nil); return err }, errInvalidOption},
		{"negative fenced expected version", func() error { _, err := s.FencedSetIfVersion(ctx, good, "k", -2, nil); return err }, errInvalidOption},
		{"zero attempts", func() error { _, err := s.Modify(ctx, "k", 0, inc); return err }, errInvalidOption},
		{"nil update function", func() error { _, err := s.FencedUpdate(ctx, good, "k", nil); return err }, errInvalidOption},
		{"nil modify function", func() error { _, err := s.Modify(ctx, "k", 1, nil); return err }, errInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.is) {
				t.Fatalf("error %v does not match %v", err, tt.is)
			}
			if tt.is != context.Canceled && !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("error %v does not match fence.ErrInvalid", err)
			}
			for problem, words := range map[string]string{"nil context": "nil context", "too long": "longer than 1024", "ttl": "TTL"} {
				if strings.Contains(tt.name, problem) && !strings.Contains(err.Error(), words) {
					t.Errorf("error %q does not say %q", err, words)
				}
			}
			if sent := h.Take(); len(sent) != 0 {
				t.Fatalf("sent %v for a bad call", sent)
			}
		})
	}
}

// TestAdmission applies the four cases of the rule to each fenced operation
// and checks that a refusal carries the mark and changes nothing in Redis.
func TestAdmission(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	mark := fen(5, "a")
	cases := []struct {
		name  string
		f     fence.Fence
		admit bool
	}{
		{"lower token", fen(4, "a"), false},
		{"equal token same holder", fen(5, "a"), true},
		{"equal token other holder", fen(5, "b"), false},
		{"higher token", fen(6, "b"), true},
	}
	ops := []struct {
		name string
		run  func(f fence.Fence, key string) error
	}{
		{"get", func(f fence.Fence, key string) error { _, err := s.FencedGet(ctx, f, key); return err }},
		{"set", func(f fence.Fence, key string) error { _, err := s.FencedSet(ctx, f, key, []byte("new")); return err }},
		{"delete", func(f fence.Fence, key string) error { return s.FencedDelete(ctx, f, key) }},
		{"update", func(f fence.Fence, key string) error {
			_, err := s.FencedUpdate(ctx, f, key, func(old Value) ([]byte, error) { return append(old.Data, '!'), nil })
			return err
		}},
	}
	for _, op := range ops {
		for _, tc := range cases {
			t.Run(op.name+"/"+tc.name, func(t *testing.T) {
				key := op.name + ":" + strings.ReplaceAll(tc.name, " ", "-")
				if _, err := s.FencedSet(ctx, mark, key, []byte("old")); err != nil {
					t.Fatal(err)
				}
				before := rawState(t, c, s.Prefix()+key)
				err := op.run(tc.f, key)
				if tc.admit {
					if err != nil {
						t.Fatalf("%v refused against mark %v: %v", tc.f, mark, err)
					}
					if got, _ := s.HighWater(ctx, key); got != tc.f {
						t.Fatalf("mark after admission = %v, want %v", got, tc.f)
					}
					return
				}
				if !errors.Is(err, fence.ErrStale) {
					t.Fatalf("%v admitted against mark %v: err = %v", tc.f, mark, err)
				}
				if hw, ok := fence.LostTo(err); !ok || hw != mark {
					t.Fatalf("stale error carries mark %v, %v; want %v", hw, ok, mark)
				}
				if !strings.Contains(err.Error(), key) {
					t.Fatalf("error %q does not name the key", err)
				}
				if after := rawState(t, c, s.Prefix()+key); after != before {
					t.Fatalf("refused %s changed the key", op.name)
				}
			})
		}
	}
}

func TestResourceMismatch(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	if _, err := s.FencedSet(ctx, fen(3, "a"), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	before := rawState(t, c, s.Prefix()+"k")
	other := fence.Fence{Resource: "other", Token: 9, Holder: "b"}
	_, err := s.FencedSet(ctx, other, "k", []byte("w"))
	var re *ResourceError
	if !errors.Is(err, ErrResourceMismatch) || !errors.As(err, &re) || re.Resource != "account" || re.Key != "k" {
		t.Fatalf("Set with another resource: %v", err)
	}
	if errors.Is(err, fence.ErrStale) {
		t.Fatal("resource mismatch matches ErrStale")
	}
	if after := rawState(t, c, s.Prefix()+"k"); after != before {
		t.Fatal("refused write changed the key")
	}
}

// TestFencedReadRaisesMarkOnMissingKey checks that a fenced read of a key
// with no value reports ErrNotFound and still fences out older holders.
func TestFencedReadRaisesMarkOnMissingKey(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	v, err := s.FencedGet(ctx, fen(2, "b"), "new")
	if !errors.Is(err, fence.ErrNotFound) || v.Exists || v.Version != 0 {
		t.Fatalf("Get of missing key = %+v, %v; want ErrNotFound at version 0", v, err)
	}
	if _, err := s.FencedSet(ctx, fen(1, "a"), "new", []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older holder's write after a newer fenced read: %v; want ErrStale", err)
	}
	if _, err := s.FencedSet(ctx, fen(2, "b"), "new", []byte("mine")); err != nil {
		t.Fatalf("reader's own write refused: %v", err)
	}
	got, err := s.FencedGet(ctx, fen(2, "b"), "new")
	if err != nil || string(got.Data) != "mine" || got.Version != 1 {
		t.Fatalf("Get = %+v, %v; want mine at version 1", got, err)
	}
}

func TestDeleteKeepsMark(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := context.Background()
	if _, err := s.FencedSet(ctx, fen(5, "a"), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.FencedDelete(ctx, fen(5, "a"), "k"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Load(ctx, "k"); !errors.Is(err, fence.ErrNotFound) || v.Version != 2 {
		t.Fatalf("Load after delete = %+v, %v; want ErrNotFound at version 2", v, err)
	}
	if ttl := c.PTTL(ctx, s.Prefix()+"k").Val(); ttl != -1 {
		t.Fatalf("deleted key has lifetime %v; want none (mark kept forever)", ttl)
	}
	if _, err := s.FencedSet(ctx, fen(4, "z"), "k", []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older holder's write after delete: %v; want ErrStale", err)
	}
	if hw, err := s.HighWater(ctx, "k"); err != nil || hw != fen(5, "a") {
		t.Fatalf("mark after delete = %v, %v; want %v", hw, err, fen(5, "a"))
	}
	// Deleting again is no error and does not move the version.
	if err := s.FencedDelete(ctx, fen(6, "b"), "k"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Load(ctx, "k"); v.Version != 2 {
		t.Fatalf("version after deleting nothing = %d, want 2", v.Version)
	}
}
