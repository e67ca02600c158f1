package redis

import (
	"context"
	"testing"
)

// TestPanicInFunctionWritesNothing checks that a panic in the function given
// to Update or Modify reaches the caller unchanged, that the call wrote no
// value (the key keeps its bytes and its version), and that the next call on
// the key works.
func TestPanicInFunctionWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	type boom struct{ n int }
	calls := map[string]func(key string, fn func(Value) ([]byte, error)) error{
		"Update": func(key string, fn func(Value) ([]byte, error)) error {
			_, err := s.FencedUpdate(ctx, fen(1, "a"), key, fn)
			return err
		},
		"Modify": func(key string, fn func(Value) ([]byte, error)) error {
			_, err := s.Modify(ctx, key, 3, fn)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			key := "panic:" + name
			if _, err := s.FencedSet(ctx, fen(1, "a"), key, []byte("before")); err != nil {
				t.Fatal(err)
			}
			want := &boom{7}
			var got any
			func() {
				defer func() { got = recover() }()
				_ = call(key, func(Value) ([]byte, error) { panic(want) })
			}()
			if got != any(want) {
				t.Fatalf("recovered %v; want the function's own panic value", got)
			}
			v, err := s.Load(ctx, key)
			if err != nil || string(v.Data) != "before" || v.Version != 1 {
				t.Fatalf("after the panic the key holds %q at version %d (%v); want \"before\" at 1", v.Data, v.Version, err)
			}
			if err := call(key, func(Value) ([]byte, error) { return []byte("after"), nil }); err != nil {
				t.Fatalf("next call on the key: %v", err)
			}
		})
	}
}
