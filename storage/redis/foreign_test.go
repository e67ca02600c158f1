package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// foreignShapes are keys this store did not write, each as the fields (for a
// hash) or the commands that make it. Shapes that carry the mark account/5/a
// are the ones a fenced call with fen(5, "a") would take its fast path on,
// were it not for their other fields or values.
var foreignShapes = []struct {
	name   string
	fields []string                                                       // a hash of these field/value pairs
	make   func(ctx context.Context, c *goredis.Client, key string) error // or another type
}{
	{name: "string", make: func(ctx context.Context, c *goredis.Client, key string) error {
		return c.Set(ctx, key, "plain", 0).Err()
	}},
	{name: "list", make: func(ctx context.Context, c *goredis.Client, key string) error {
		return c.RPush(ctx, key, "a", "b").Err()
	}},
	{name: "set", make: func(ctx context.Context, c *goredis.Client, key string) error {
		return c.SAdd(ctx, key, "a").Err()
	}},

	// An application's hashes, with fields this store also uses.
	{name: "app hash with a version", fields: []string{"ver", "3", "name", "bob"}},
	{name: "app hash with a value", fields: []string{"v", "x", "name", "bob"}},
	{name: "hash of other fields", fields: []string{"field", "x"}},

	// The store's shape plus another field.
	{name: "extra field", fields: []string{"v", "x", "ver", "2", "name", "bob"}},
	{name: "extra field beside the mark", fields: []string{"v", "x", "ver", "2", "tok", "5", "hold", "a", "res", "account", "name", "bob"}},
	{name: "extra field beside mark and retention", fields: []string{"v", "x", "ver", "2", "tok", "5", "hold", "a", "res", "account", "rt", "5000", "name", "bob"}},
	{name: "extra field on a deleted value", fields: []string{"ver", "2", "tok", "5", "hold", "a", "res", "account", "name", "bob"}},

	// A version that is not a count of the store's form.
	{name: "ver not a number", fields: []string{"v", "x", "ver", "abc"}},
	{name: "ver not a number beside the mark", fields: []string{"v", "x", "ver", "abc", "tok", "5", "hold", "a", "res", "account"}},
	{name: "ver a fraction", fields: []string{"v", "x", "ver", "1.5", "tok", "5", "hold", "a", "res", "account"}},
	{name: "ver negative", fields: []string{"v", "x", "ver", "-1"}},
	{name: "ver hexadecimal", fields: []string{"v", "x", "ver", "0x10", "tok", "5", "hold", "a", "res", "account"}},
	{name: "ver with a space", fields: []string{"v", "x", "ver", " 3"}},
	{name: "ver with an exponent", fields: []string{"v", "x", "ver", "1e3", "tok", "5", "hold", "a", "res", "account"}},
	{name: "ver infinite", fields: []string{"v", "x", "ver", "inf"}},
	{name: "ver empty", fields: []string{"v", "x", "ver", ""}},
	{name: "ver with a leading zero", fields: []string{"v", "x", "ver", "07", "tok", "5", "hold", "a", "res", "account"}},
	{name: "ver too long", fields: []string{"v", "x", "ver", "99999999999999999999"}},

	// Fields missing, or present without the ones they come with.
	{name: "no ver", fields: []string{"v", "x"}},
	{name: "no ver beside the mark", fields: []string{"v", "x", "tok", "5", "hold", "a", "res", "account"}},
	{name: "tok alone", fields: []string{"ver", "1", "tok", "5"}},
	{name: "mark without res", fields: []string{"v", "x", "ver", "1", "tok", "5", "hold", "a"}},
	{name: "mark without tok", fields: []string{"v", "x", "ver", "1", "hold", "a", "res", "account"}},
	{name: "exp without v", fields: []string{"ver", "1", "exp", "99999999999999"}},

	// The store's fields with values of another form.
	{name: "tok not a number", fields: []string{"v", "x", "ver", "1", "tok", "abc", "hold", "a", "res", "account"}},
	{name: "tok zero", fields: []string{"v", "x", "ver", "1", "tok", "0", "hold", "a", "res", "account"}},
	{name: "tok beyond int64", fields: []string{"v", "x", "ver", "1", "tok", "9223372036854775808", "hold", "a", "res", "account"}},
	{name: "hold empty", fields: []string{"v", "x", "ver", "1", "tok", "5", "hold", "", "res", "account"}},
	{name: "res empty", fields: []string{"v", "x", "ver", "1", "tok", "5", "hold", "a", "res", ""}},
	{name: "exp not a number", fields: []string{"v", "x", "ver", "1", "exp", "soon"}},
	{name: "rt not a number", fields: []string{"v", "x", "ver", "2", "tok", "5", "hold", "a", "res", "account", "rt", "long"}},
	{name: "rt zero", fields: []string{"v", "x", "ver", "2", "tok", "5", "hold", "a", "res", "account", "rt", "0"}},
}

// keyState is everything Redis holds for a key: its DUMP and its remaining
// lifetime in ms (-1: none, -2: no key).
type keyState struct {
	dump string
	pttl time.Duration
}

func stateOf(t *testing.T, c *goredis.Client, key string) keyState {
	t.Helper()
	ctx := context.Background()
	dump, err := c.Dump(ctx, key).Result()
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	pttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return keyState{dump, pttl}
}

// unchanged reports whether after is before, byte for byte, with a lifetime
// that has only run down since (by less than a minute).
func (before keyState) unchanged(after keyState) bool {
	if before.dump != after.dump {
		return false
	}
	if before.pttl < 0 {
		return after.pttl == before.pttl
	}
	return after.pttl > 0 && after.pttl <= before.pttl && after.pttl > before.pttl-time.Minute
}

// TestForeignKeysLeftAsTheyWere checks that every call of the store answers
// fence.ErrWrongType, naming the key, for a key it did not write (another
// type, or a hash not of the exact shape it writes), and leaves the key byte
// for byte as it was, lifetime included. Each shape is tried with and without
// a lifetime, on a store that keeps marks for a while and one whose every
// send is marked as a possible resend (a client whose options it cannot
// read), so that the paths that first look for a retry record are covered.
func TestForeignKeysLeftAsTheyWere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	retained, c := newStore(t, WithMarkRetention(time.Hour))
	resent, err := New(scripter{c}, WithPrefix(retained.Prefix()+"resent:"))
	if err != nil {
		t.Fatal(err)
	}
	mark, newer := fen(5, "a"), fen(6, "b")
	calls := []struct {
		name string
		run  func(s *Store, key string) error
	}{
		{"Get", func(s *Store, key string) error { _, err := s.FencedGet(ctx, mark, key); return err }},
		{"Get newer", func(s *Store, key string) error { _, err := s.FencedGet(ctx, newer, key); return err }},
		{"Set", func(s *Store, key string) error { _, err := s.FencedSet(ctx, mark, key, []byte("w")); return err }},
		{"Set newer", func(s *Store, key string) error { _, err := s.FencedSet(ctx, newer, key, []byte("w")); return err }},
		{"Set with TTL", func(s *Store, key string) error {
			_, err := s.FencedSet(ctx, mark, key, []byte("w"), WithTTL(time.Hour))
			return err
		}},
		{"SetIfVersion", func(s *Store, key string) error {
			_, err := s.FencedSetIfVersion(ctx, mark, key, 2, []byte("w"))
			return err
		}},
		{"SetIfVersion 3", func(s *Store, key string) error {
			_, err := s.FencedSetIfVersion(ctx, newer, key, 3, []byte("w"))
			return err
		}},
		{"Delete", func(s *Store, key string) error { return s.FencedDelete(ctx, mark, key) }},
		{"Delete newer", func(s *Store, key string) error { return s.FencedDelete(ctx, newer, key) }},
		{"Update", func(s *Store, key string) error {
			_, err := s.FencedUpdate(ctx, mark, key, func(Value) ([]byte, error) { return []byte("w"), nil })
			return err
		}},
		{"Load", func(s *Store, key string) error { _, err := s.Load(ctx, key); return err }},
		{"HighWater", func(s *Store, key string) error { _, err := s.HighWater(ctx, key); return err }},
		{"CompareAndSet 0", func(s *Store, key string) error {
			_, err := s.CompareAndSet(ctx, key, 0, []byte("w"))
			return err
		}},
		{"CompareAndSet 2", func(s *Store, key string) error {
			_, err := s.CompareAndSet(ctx, key, 2, []byte("w"), WithTTL(time.Hour))
			return err
		}},
		{"CompareAndSet 3", func(s *Store, key string) error {
			_, err := s.CompareAndSet(ctx, key, 3, []byte("w"))
			return err
		}},
		{"CompareAndDelete 0", func(s *Store, key string) error { _, err := s.CompareAndDelete(ctx, key, 0); return err }},
		{"CompareAndDelete 2", func(s *Store, key string) error { _, err := s.CompareAndDelete(ctx, key, 2); return err }},
		{"Modify", func(s *Store, key string) error {
			_, err := s.Modify(ctx, key, 2, func(Value) ([]byte, error) { return []byte("w"), nil })
			return err
		}},
	}
	stores := []struct {
		name string
		s    *Store
	}{{"retained", retained}, {"resent", resent}}
	for _, shape := range foreignShapes {
		for _, ttl := range []time.Duration{0, time.Hour} {
			for _, st := range stores {
				name := shape.name + "/" + st.name
				if ttl > 0 {
					name += "/ttl"
				}
				t.Run(name, func(t *testing.T) {
					key := "foreign:" + name
					rkey := st.s.redisKey(key)
					var err error
					if shape.make != nil {
						err = shape.make(ctx, c, rkey)
					} else {
						err = c.HSet(ctx, rkey, shape.fields).Err()
					}
					if err == nil && ttl > 0 {
						err = c.PExpire(ctx, rkey, ttl).Err()
					}
					if err != nil {
						t.Fatal(err)
					}
					before := stateOf(t, c, rkey)
					for _, call := range calls {
						err := call.run(st.s, key)
						if !errors.Is(err, fence.ErrWrongType) || !strings.Contains(err.Error(), key) {
							t.Errorf("%s: error %v; want one matching fence.ErrWrongType naming %q", call.name, err, key)
						}
						if after := stateOf(t, c, rkey); !before.unchanged(after) {
							t.Fatalf("%s changed the key: %+v -> %+v", call.name, before, after)
						}
					}
				})
			}
		}
	}
}

// TestOwnShapesAccepted checks the other side of TestForeignKeysLeftAsTheyWere:
// every shape this store writes (a value with or without a mark, an expiry,
// a retention; a deleted value; a mark without a value) is read and written
// again by every call.
func TestOwnShapesAccepted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, WithMarkRetention(time.Hour))
	plain, c := newStore(t)
	f := fen(5, "a")
	shapes := map[string]func(s *Store, key string) error{
		"value by compare-and-set": func(s *Store, key string) error { _, err := s.CompareAndSet(ctx, key, 0, []byte("x")); return err },
		"expiring value by compare-and-set": func(s *Store, key string) error {
			_, err := s.CompareAndSet(ctx, key, 0, []byte("x"), WithTTL(time.Hour))
			return err
		},
		"deleted by compare-and-delete": func(s *Store, key string) error {
			if _, err := s.CompareAndSet(ctx, key, 0, []byte("x")); err != nil {
				return err
			}
			_, err := s.CompareAndDelete(ctx, key, 1)
			return err
		},
		"fenced value": func(s *Store, key string) error { _, err := s.FencedSet(ctx, f, key, []byte("x")); return err },
		"expiring value": func(s *Store, key string) error {
			_, err := s.FencedSet(ctx, f, key, []byte("x"), WithTTL(time.Hour))
			return err
		},
		"mark only":     func(s *Store, key string) error { _, err := s.FencedGet(ctx, f, key); return ignoreNotFound(err) },
		"fenced delete": func(s *Store, key string) error { return s.FencedDelete(ctx, f, key) },
	}
	for name, mk := range shapes {
		for _, st := range []*Store{s, plain} {
			key := name
			if err := mk(st, key); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			v, err := st.Load(ctx, key)
			if err = ignoreNotFound(err); err != nil {
				t.Fatalf("%s: Load: %v", name, err)
			}
			if _, err := st.FencedGet(ctx, f, key); ignoreNotFound(err) != nil {
				t.Fatalf("%s: Get: %v", name, err)
			}
			if _, err := st.CompareAndSet(ctx, key, v.Version, []byte("y")); err != nil {
				t.Fatalf("%s: CompareAndSet: %v", name, err)
			}
			if _, err := st.FencedSet(ctx, f, key, []byte("z")); err != nil {
				t.Fatalf("%s: Set: %v (fields %v)", name, err, c.HGetAll(ctx, st.redisKey(key)).Val())
			}
		}
	}
}

func ignoreNotFound(err error) error {
	if errors.Is(err, fence.ErrNotFound) {
		return nil
	}
	return err
}
