package redis

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// valueFields are the fields a value hash holds for itself; anything else
// in it would be bookkeeping.
var valueFields = map[string]bool{"v": true, "ver": true, "tok": true, "hold": true, "res": true, "exp": true, "rt": true}

// leftovers counts what a store's keys hold beyond their values: its
// record keys, and hash fields other than a value's own.
func leftovers(t *testing.T, c *goredis.Client, s *Store) int {
	t.Helper()
	ctx := context.Background()
	prefix := s.Prefix()
	records, err := scanAll(c, "*}"+s.storeID+"*")
	if err != nil {
		t.Fatal(err)
	}
	n := len(records)
	values, err := scanAll(c, prefix+"*")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range values {
		fields, err := c.HKeys(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if !valueFields[f] {
				n++
			}
		}
	}
	return n
}

// TestEveryChangeLeavesOneRecord checks that every call that changes
// something leaves exactly one record, a small key of its own that expires
// after the store's window, that reads and refusals that change nothing
// leave none, and that the records go by themselves once the window has
// passed, with no further write of the key.
func TestEveryChangeLeavesOneRecord(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	const window = 3 * time.Second
	s, c := newShortStore(t, WithRetryWindow(window))
	ctx := context.Background()
	a := fen(2, "a")
	steps := []struct {
		name   string
		run    func() error
		record bool
	}{
		{"Get that raises the mark", func() error { _, err := s.FencedGet(ctx, a, "k"); return ignore(err, fence.ErrNotFound) }, true},
		{"Set", func() error { _, err := s.FencedSet(ctx, a, "k", []byte("1")); return err }, true},
		{"Get that raises nothing", func() error { _, err := s.FencedGet(ctx, a, "k"); return err }, false},
		{"Load", func() error { _, err := s.Load(ctx, "k"); return err }, false},
		{"SetIfVersion", func() error { _, err := s.FencedSetIfVersion(ctx, a, "k", 1, []byte("2")); return err }, true},
		{"stale Set", func() error { _, err := s.FencedSet(ctx, fen(1, "z"), "k", nil); return ignore(err, fence.ErrStale) }, false},
		{"stale Get", func() error { _, err := s.FencedGet(ctx, fen(1, "z"), "k"); return ignore(err, fence.ErrStale) }, false},
		{"conflicting SetIfVersion", func() error {
			_, err := s.FencedSetIfVersion(ctx, a, "k", 1, nil)
			return ignore(err, fence.ErrConflict)
		}, false},
		{"CompareAndSet", func() error { _, err := s.CompareAndSet(ctx, "k", 2, []byte("3")); return err }, true},
		{"conflicting CompareAndSet", func() error {
			_, err := s.CompareAndSet(ctx, "k", 0, nil)
			return ignore(err, fence.ErrConflict)
		}, false},
		{"CompareAndDelete", func() error { _, err := s.CompareAndDelete(ctx, "k", 3); return err }, true},
		{"Delete", func() error { return s.FencedDelete(ctx, a, "k") }, true},
		{"Update", func() error {
			_, err := s.FencedUpdate(ctx, a, "k", func(Value) ([]byte, error) { return []byte("5"), nil })
			return err
		}, true},
		{"Modify", func() error {
			_, err := s.Modify(ctx, "k", 1, func(Value) ([]byte, error) { return []byte("6"), nil })
			return err
		}, true},
		{"newer holder's Get", func() error { _, err := s.FencedGet(ctx, fen(3, "b"), "k"); return err }, true},
	}
	want := 0
	for _, st := range steps {
		if err := st.run(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.record {
			want++
		}
		keys := recordKeys(t, c, s, "k")
		if len(keys) != want {
			t.Fatalf("after %s: %d records; want %d", st.name, len(keys), want)
		}
		for _, k := range keys {
			if typ := c.Type(ctx, k).Val(); typ != "string" {
				t.Fatalf("record %s is a %s; want a string", k, typ)
			}
			if d := c.PTTL(ctx, k).Val(); d <= 0 || d > window {
				t.Fatalf("record %s lives %v more; want its own window, at most %v", k, d, window)
			}
		}
	}
	if n := leftovers(t, c, s) - want; n != 0 {
		t.Fatalf("the value's hash holds %d fields beyond the value's own", n)
	}
	eventually(t, window+10*time.Second, "every record gone without another write", func() bool {
		return len(recordKeys(t, c, s, "k")) == 0
	})
	if v, err := s.Load(ctx, "k"); err != nil || string(v.Data) != "6" {
		t.Fatalf("value %q, %v", v.Data, err)
	}
}

// TestRecordsGoWithoutWrites checks that the records of keys that are never
// written again go once the window has passed, for many keys written once
// and for one key written many times: nothing is left but the values.
func TestRecordsGoWithoutWrites(t *testing.T) {
	t.Parallel()
	const window = time.Second
	s, c := newShortStore(t, WithRetryWindow(window))
	ctx := context.Background()
	f := fen(1, "a")
	for i := range 200 {
		if _, err := s.FencedSet(ctx, f, "once:"+strconv.Itoa(i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for range 300 {
		if _, err := s.FencedSet(ctx, f, "hot", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if n := leftovers(t, c, s); n == 0 {
		t.Fatal("no records within the window: the test cannot see them")
	}
	eventually(t, window+15*time.Second, "every record gone one window after the last write", func() bool {
		return leftovers(t, c, s) == 0
	})
}

// TestHotKeyHashStaysSmall checks that no key grows with the write rate:
// the value's hash keeps its own fields however often it is written, and
// each record is a small key of its own.
func TestHotKeyHashStaysSmall(t *testing.T) {
	t.Parallel()
	s, c := newShortStore(t, WithRetryWindow(time.Minute))
	ctx := context.Background()
	f := fen(1, "a")
	key := s.Prefix() + "hot"
	if _, err := s.FencedSet(ctx, f, "hot", []byte("v")); err != nil {
		t.Fatal(err)
	}
	fields := c.HLen(ctx, key).Val()
	for range 500 {
		if _, err := s.FencedSet(ctx, f, "hot", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.HLen(ctx, key).Val(); n != fields {
		t.Fatalf("the value's hash grew from %d to %d fields over 500 writes", fields, n)
	}
	keys := recordKeys(t, c, s, "hot")
	if len(keys) != 501 {
		t.Fatalf("%d records for 501 writes; want one each", len(keys))
	}
	for _, k := range keys[:10] {
		if n := c.MemoryUsage(ctx, k).Val(); n > 200 {
			t.Fatalf("record %s takes %d bytes", k, n)
		}
	}
	// Clean up now rather than after a minute.
	if err := c.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestCompareAndDeleteOfNothingCreatesNoValue pins that a compare-and-delete
// of a key that never existed creates no value hash; only its record, which
// goes by itself.
func TestCompareAndDeleteOfNothingCreatesNoValue(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	const retention = time.Second
	s, c := newShortStore(t, WithMarkRetention(retention), WithRetryWindow(retention))
	ctx := context.Background()
	key := s.Prefix() + "k"
	if _, err := s.FencedSet(ctx, fen(5, "a"), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.FencedDelete(ctx, fen(5, "a"), "k"); err != nil {
		t.Fatal(err)
	}
	before := c.HGetAll(ctx, key).Val()
	// Let half the retention run down, then refuse an old holder.
	eventually(t, 10*time.Second, "retention running down", func() bool {
		return c.PTTL(ctx, key).Val() < retention/2
	})
	refusals := map[string]func() error{
		"Get":    func() error { _, err := s.FencedGet(ctx, fen(4, "z"), "k"); return err },
		"Set":    func() error { _, err := s.FencedSet(ctx, fen(4, "z"), "k", []byte("late")); return err },
		"Delete": func() error { return s.FencedDelete(ctx, fen(4, "z"), "k") },
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
	if _, err := s.FencedGet(ctx, fence.Fence{Resource: "other", Token: 9, Holder: "o"}, "k"); !errors.Is(err, ErrResourceMismatch) {
		t.Fatalf("other resource: %v", err)
	}
	if d := c.PTTL(ctx, key).Val(); d < retention/2 {
		t.Fatalf("other resource's refusal left the retention at %v", d)
	}
}
