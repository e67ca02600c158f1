package redis

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// records returns how many write records and queue entries key's hash holds.
func records(t *testing.T, c *goredis.Client, key string) (w, q int) {
	t.Helper()
	fields, err := c.HKeys(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		switch {
		case strings.HasPrefix(f, "w:"):
			w++
		case strings.HasPrefix(f, "q:"):
			q++
		}
	}
	return w, q
}

// TestRecordsLastTheWindow checks that every kind of write leaves one record,
// that reads and refusals leave none, and that records older than the retry
// window are dropped by later writes, a few per write, so that a key holds
// about the records of its last window.
func TestRecordsLastTheWindow(t *testing.T) {
	const window = time.Second
	s, c := newStore(t, WithRetryWindow(window))
	ctx := context.Background()
	key := s.Prefix() + "k"
	a := fen(2, "a")
	steps := []struct {
		name   string
		run    func() error
		record bool
	}{
		{"Set", func() error { _, err := s.Set(ctx, a, "k", []byte("1")); return err }, true},
		{"Get", func() error { _, err := s.Get(ctx, a, "k"); return err }, false},
		{"Load", func() error { _, err := s.Load(ctx, "k"); return err }, false},
		{"SetIfVersion", func() error { _, err := s.SetIfVersion(ctx, a, "k", 1, []byte("2")); return err }, true},
		{"stale Set", func() error { _, err := s.Set(ctx, fen(1, "z"), "k", nil); return ignore(err, fence.ErrStale) }, false},
		{"conflicting SetIfVersion", func() error {
			_, err := s.SetIfVersion(ctx, a, "k", 1, nil)
			return ignore(err, fence.ErrConflict)
		}, false},
		{"CompareAndSet", func() error { _, err := s.CompareAndSet(ctx, "k", 2, []byte("3")); return err }, true},
		{"conflicting CompareAndSet", func() error {
			_, err := s.CompareAndSet(ctx, "k", 0, nil)
			return ignore(err, fence.ErrConflict)
		}, false},
		{"CompareAndDelete", func() error { _, err := s.CompareAndDelete(ctx, "k", 3); return err }, true},
		{"Delete", func() error { return s.Delete(ctx, a, "k") }, true},
		{"Update", func() error {
			_, err := s.Update(ctx, a, "k", func(Value) ([]byte, error) { return []byte("5"), nil })
			return err
		}, true},
		{"Modify", func() error {
			_, err := s.Modify(ctx, "k", 1, func(Value) ([]byte, error) { return []byte("6"), nil })
			return err
		}, true},
	}
	want := 0
	for _, st := range steps {
		if err := st.run(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.record {
			want++
		}
		if w, q := records(t, c, key); w != want || q != want {
			t.Fatalf("after %s: %d records, %d queue entries; want %d of each", st.name, w, q, want)
		}
	}
	last := c.Time(ctx).Val()
	eventually(t, 10*time.Second, "the retry window passing", func() bool {
		return c.Time(ctx).Val().Sub(last) > window
	})
	// Each write drops up to four expired records and adds its own.
	for i := range 3 {
		if _, err := s.Set(ctx, a, "k", []byte("x")); err != nil {
			t.Fatal(err)
		}
		wantW := max(want-4*(i+1), 0) + i + 1
		if w, q := records(t, c, key); w != wantW || q != wantW {
			t.Fatalf("write %d after the window: %d records, %d queue entries; want %d", i+1, w, q, wantW)
		}
	}
	if v, err := s.Load(ctx, "k"); err != nil || string(v.Data) != "x" {
		t.Fatalf("value %q, %v", v.Data, err)
	}
}

// TestCompareAndDeleteOfNothingIsNotRecorded pins the one write that leaves
// no record: a compare-and-delete of a key that never existed changes
// nothing, so it creates no hash.
func TestCompareAndDeleteOfNothingIsNotRecorded(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	if v, err := s.CompareAndDelete(ctx, "none", 0); err != nil || v != 0 {
		t.Fatalf("CompareAndDelete of nothing = %d, %v", v, err)
	}
	if n := c.Exists(ctx, s.Prefix()+"none").Val(); n != 0 {
		t.Fatal("a compare-and-delete of nothing created the key")
	}
}

// TestRefusalKeepsMark checks that a refused fence restarts the retention of
// the mark that refused it, and changes nothing else, so that an old holder
// that keeps retrying is not admitted while it does.
func TestRefusalKeepsMark(t *testing.T) {
	const retention = time.Second
	s, c := newStore(t, WithMarkRetention(retention), WithRetryWindow(retention))
	ctx := context.Background()
	key := s.Prefix() + "k"
	if _, err := s.Set(ctx, fen(5, "a"), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, fen(5, "a"), "k"); err != nil {
		t.Fatal(err)
	}
	before := c.HGetAll(ctx, key).Val()
	// Let half the retention run down, then refuse an old holder.
	eventually(t, 10*time.Second, "retention running down", func() bool {
		return c.PTTL(ctx, key).Val() < retention/2
	})
	refusals := map[string]func() error{
		"Get":    func() error { _, err := s.Get(ctx, fen(4, "z"), "k"); return err },
		"Set":    func() error { _, err := s.Set(ctx, fen(4, "z"), "k", []byte("late")); return err },
		"Delete": func() error { return s.Delete(ctx, fen(4, "z"), "k") },
	}
	for name, refuse := range refusals {
		low := c.PTTL(ctx, key).Val()
		if err := refuse(); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("old holder's %s: %v; want ErrStale", name, err)
		}
		if after := c.PTTL(ctx, key).Val(); after <= low {
			t.Fatalf("old holder's %s left the retention at %v (was %v); want it restarted", name, after, low)
		}
		if after := c.HGetAll(ctx, key).Val(); !maps.Equal(before, after) {
			t.Fatalf("old holder's %s changed the hash: %v -> %v", name, before, after)
		}
		eventually(t, 10*time.Second, "retention running down", func() bool {
			return c.PTTL(ctx, key).Val() < retention/2
		})
	}
	// Another resource's refusal keeps the mark too.
	if _, err := s.Get(ctx, fence.Fence{Resource: "other", Token: 9, Holder: "o"}, "k"); !errors.Is(err, ErrResourceMismatch) {
		t.Fatalf("other resource: %v", err)
	}
	if d := c.PTTL(ctx, key).Val(); d < retention/2 {
		t.Fatalf("other resource's refusal left the retention at %v", d)
	}
}
