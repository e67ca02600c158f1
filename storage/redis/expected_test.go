package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// TestExpectedVersion checks every version-checked write (CompareAndSet,
// SetIfVersion, CompareAndDelete) against expected versions below, equal to
// and above the key's, on a missing key, a live one, a deleted one, an
// expired one, one expired and written again, and one whose hash Redis
// collected (WithMarkRetention) and that started again from version 0. Only
// the key's own version is admitted: every other, including each version the
// key held before, gets a ConflictError carrying the key's version and
// changes nothing.
func TestExpectedVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kept, c := newStore(t)
	collected, _ := newShortStore(t, WithRetryWindow(time.Second), WithMarkRetention(time.Second))
	expire := func(t *testing.T, s *Store, key string, expected int64) {
		t.Helper()
		if _, err := s.CompareAndSet(ctx, key, expected, []byte("short"), WithTTL(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the value expires", func() bool {
			_, err := s.Load(ctx, key)
			return errors.Is(err, fence.ErrNotFound)
		})
	}
	write := func(t *testing.T, s *Store, key string, expected int64) {
		t.Helper()
		if _, err := s.CompareAndSet(ctx, key, expected, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	situations := []struct {
		name    string
		store   *Store
		prepare func(t *testing.T, s *Store, key string)
		ver     int64   // the key's version once prepared
		live    bool    // whether it holds a live value
		before  []int64 // versions the key held before
	}{
		{name: "missing", store: kept, prepare: func(*testing.T, *Store, string) {}},
		{name: "live", store: kept, ver: 2, live: true, before: []int64{0, 1}, prepare: func(t *testing.T, s *Store, key string) {
			write(t, s, key, 0)
			write(t, s, key, 1)
		}},
		{name: "deleted", store: kept, ver: 2, before: []int64{0, 1}, prepare: func(t *testing.T, s *Store, key string) {
			write(t, s, key, 0)
			if _, err := s.CompareAndDelete(ctx, key, 1); err != nil {
				t.Fatal(err)
			}
		}},
		// An expiry counts as a delete: the version moves on by one.
		{name: "expired", store: kept, ver: 2, before: []int64{0, 1}, prepare: func(t *testing.T, s *Store, key string) {
			expire(t, s, key, 0)
		}},
		{name: "expired and written again", store: kept, ver: 3, live: true, before: []int64{0, 1, 2}, prepare: func(t *testing.T, s *Store, key string) {
			expire(t, s, key, 0)
			write(t, s, key, 2)
		}},
		// Once Redis has collected the hash, the version starts again from 0
		// (see WithMarkRetention); versions from before are above it.
		{name: "collected", store: collected, ver: 0, before: []int64{1, 2}, prepare: func(t *testing.T, s *Store, key string) {
			expire(t, s, key, 0)
			eventually(t, 10*time.Second, "Redis collects the hash", func() bool {
				return c.Exists(ctx, s.redisKey(key)).Val() == 0
			})
		}},
	}
	ops := []struct {
		name string
		run  func(s *Store, key string, expected int64) (int64, error)
	}{
		{"CompareAndSet", func(s *Store, key string, expected int64) (int64, error) {
			return s.CompareAndSet(ctx, key, expected, []byte("new"))
		}},
		{"SetIfVersion", func(s *Store, key string, expected int64) (int64, error) {
			// A newer fence each time: a conflict must not raise the mark.
			return s.FencedSetIfVersion(ctx, fen(fence.Token(10+expected), "w"), key, expected, []byte("new"))
		}},
		{"CompareAndDelete", func(s *Store, key string, expected int64) (int64, error) {
			return s.CompareAndDelete(ctx, key, expected)
		}},
	}
	for _, op := range ops {
		for _, sit := range situations {
			t.Run(op.name+"/"+sit.name, func(t *testing.T) {
				t.Parallel()
				s, key := sit.store, "expected:"+op.name+":"+sit.name
				sit.prepare(t, s, key)
				wrong := append([]int64{sit.ver + 1, sit.ver + 2, sit.ver + 1<<40}, sit.before...)
				if sit.ver > 0 {
					wrong = append(wrong, sit.ver-1)
				}
				for _, expected := range wrong {
					before := rawState(t, c, s.redisKey(key))
					_, err := op.run(s, key, expected)
					var ce *fence.ConflictError
					if !errors.As(err, &ce) || ce.Expected != expected || ce.Actual != sit.ver || ce.Key != key {
						t.Fatalf("expecting version %d of a key at %d: %v; want a conflict finding %d", expected, sit.ver, err, sit.ver)
					}
					if after := rawState(t, c, s.redisKey(key)); after != before {
						t.Fatalf("expecting version %d: a conflict changed the key", expected)
					}
				}
				want := sit.ver + 1
				if op.name == "CompareAndDelete" && !sit.live {
					want = sit.ver // nothing to delete: the version stays
				}
				if got, err := op.run(s, key, sit.ver); err != nil || got != want {
					t.Fatalf("expecting the key's own version %d: %d, %v; want version %d", sit.ver, got, err, want)
				}
				if v, err := s.Load(ctx, key); ignoreNotFound(err) != nil || v.Version != want {
					t.Fatalf("Load after the write = %+v, %v; want version %d", v, err, want)
				}
			})
		}
	}
}
