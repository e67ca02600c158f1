package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestShorterRetentionKeepsOthersMarks has stores with different mark
// retentions share keys and checks that the hash of a key always lives as
// long as the longest retention of the stores that wrote it: a store with a
// shorter retention (or one at all) never lets Redis collect a mark that
// another store keeps longer (or for ever).
func TestShorterRetentionKeepsOthersMarks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := noRetryClient(t)
	prefix := testenv.Prefix(t)
	store := func(retention time.Duration) *Store {
		opts := []Option{WithPrefix(prefix), WithRetryWindow(time.Second)}
		if retention > 0 {
			opts = append(opts, WithMarkRetention(retention))
		}
		s, err := New(c, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	forever, hour, second := store(0), store(time.Hour), store(time.Second)
	f := fen(5, "a")
	pttl := func(key string) time.Duration { return c.PTTL(ctx, prefix+key).Val() }
	must := func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, fence.ErrNotFound) {
			t.Fatal(err)
		}
	}

	// A key a store keeps for ever, deleted through a store with a retention.
	_, err := forever.FencedSet(ctx, f, "a", []byte("v"))
	must(err)
	must(second.FencedDelete(ctx, f, "a"))
	if d := pttl("a"); d != -1 {
		t.Fatalf("a mark kept for ever got a lifetime of %v from a store with a 1s retention", d)
	}

	// A key made by a store with a retention, then used by one that keeps
	// marks for ever.
	_, err = second.FencedSet(ctx, f, "b", []byte("v"))
	must(err)
	must(second.FencedDelete(ctx, f, "b"))
	if d := pttl("b"); d <= 0 || d > time.Second {
		t.Fatalf("deleted key of a 1s-retention store lives %v; want up to 1s", d)
	}
	_, err = forever.FencedGet(ctx, f, "b")
	must(err)
	if d := pttl("b"); d != -1 {
		t.Fatalf("a key read by a store that keeps marks for ever still lives %v", d)
	}
	must(second.FencedDelete(ctx, f, "b"))
	if d := pttl("b"); d != -1 {
		t.Fatalf("a store with a 1s retention shortened a mark kept for ever to %v", d)
	}

	// Two retentions: the longer one holds, whoever writes last.
	_, err = hour.FencedSet(ctx, f, "c", []byte("v"))
	must(err)
	must(hour.FencedDelete(ctx, f, "c"))
	must(second.FencedDelete(ctx, f, "c"))
	_, err = second.FencedSet(ctx, f, "c", []byte("v"), WithTTL(10*time.Millisecond))
	must(err)
	if d := pttl("c"); d < 30*time.Minute {
		t.Fatalf("a 1s-retention store's write gave a 1h-retention mark %v to live", d)
	}
	_, err = second.FencedGet(ctx, f, "c")
	must(err)
	if d := pttl("c"); d < 30*time.Minute {
		t.Fatalf("a 1s-retention store's read gave a 1h-retention mark %v to live", d)
	}
	// And the mark still refuses an older holder.
	if _, err := second.FencedSet(ctx, fen(4, "old"), "c", []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older holder's Set = %v; want ErrStale", err)
	}
}
