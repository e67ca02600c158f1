package redis

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

func atoi(t *testing.T, b []byte) int {
	t.Helper()
	n, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatalf("value %q is not a number", b)
	}
	return n
}

// TestTimelineFencedReads replays DESIGN.md section 3: A (token 1) reads and
// pauses past its lease, B (token 2) reads and writes, A wakes up and writes.
// With fenced reads and writes A's write is refused and no acknowledged
// increment is lost.
func TestTimelineFencedReads(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	a, b := fen(1, "holder-a"), fen(2, "holder-b")
	acked := 0

	// Setup: X=10, written under an earlier grant.
	if _, err := s.CompareAndSet(ctx, "x", 0, []byte("10")); err != nil {
		t.Fatal(err)
	}
	va, err := s.FencedGet(ctx, a, "x") // A: read X=10, then pause
	if err != nil {
		t.Fatal(err)
	}
	vb, err := s.FencedGet(ctx, b, "x") // B: lease of A expired; B reads X=10
	if err != nil {
		t.Fatal(err)
	}
	// A wakes up and writes X=11: refused, B's read raised the mark.
	_, err = s.FencedSet(ctx, a, "x", []byte(strconv.Itoa(atoi(t, va.Data)+1)))
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("A's late write: err = %v; want ErrStale", err)
	}
	if hw, _ := fence.LostTo(err); hw != b {
		t.Fatalf("A lost to %v, want B's fence %v", hw, b)
	}
	// B writes X=11: admitted.
	if _, err := s.FencedSet(ctx, b, "x", []byte(strconv.Itoa(atoi(t, vb.Data)+1))); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	acked++
	// A learns it lost, takes the lock again (token 3) and retries.
	c := fen(3, "holder-a-again")
	if _, err := s.FencedUpdate(ctx, c, "x", func(old Value) ([]byte, error) {
		return []byte(strconv.Itoa(atoi(t, old.Data) + 1)), nil
	}); err != nil {
		t.Fatalf("A's retry: %v", err)
	}
	acked++

	got, err := s.Load(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if n := atoi(t, got.Data); n != 10+acked {
		t.Fatalf("X = %d after %d acknowledged increments from 10: an update was lost", n, acked)
	}
}

// TestTimelineNegativeControls replays the same timeline without the guard
// and must see the lost update, so that the test above can see one too:
// once with plain GET and SET, once with fenced writes but unfenced reads
// (which DESIGN.md section 3 says is not enough).
func TestTimelineNegativeControls(t *testing.T) {
	t.Parallel()
	t.Run("plain GET and SET", func(t *testing.T) {
		s, c := newStore(t)
		ctx := context.Background()
		key := s.Prefix() + "plain-x"
		if err := c.Set(ctx, key, "10", 0).Err(); err != nil {
			t.Fatal(err)
		}
		acked := 0
		xa, err := c.Get(ctx, key).Int() // A reads, pauses
		if err != nil {
			t.Fatal(err)
		}
		xb, err := c.Get(ctx, key).Int() // B reads
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, key, xa+1, 0).Err(); err != nil { // A's late write lands
			t.Fatal(err)
		}
		acked++
		if err := c.Set(ctx, key, xb+1, 0).Err(); err != nil { // B's write lands
			t.Fatal(err)
		}
		acked++
		n, err := c.Get(ctx, key).Int()
		if err != nil {
			t.Fatal(err)
		}
		if n == 10+acked {
			t.Fatalf("plain GET/SET kept all %d increments; the timeline cannot show a lost update", acked)
		}
		t.Logf("plain GET/SET: %d increments acknowledged, X went from 10 to %d: one lost", acked, n)
	})
	t.Run("unfenced reads, fenced writes", func(t *testing.T) {
		s, _ := newStore(t)
		ctx := context.Background()
		a, b := fen(1, "holder-a"), fen(2, "holder-b")
		if _, err := s.CompareAndSet(ctx, "x", 0, []byte("10")); err != nil {
			t.Fatal(err)
		}
		acked := 0
		va, err := s.Load(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		vb, err := s.Load(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.FencedSet(ctx, a, "x", []byte(strconv.Itoa(atoi(t, va.Data)+1))); err == nil {
			acked++
		}
		if _, err := s.FencedSet(ctx, b, "x", []byte(strconv.Itoa(atoi(t, vb.Data)+1))); err == nil {
			acked++
		}
		got, err := s.Load(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if n := atoi(t, got.Data); n == 10+acked {
			t.Fatalf("unfenced reads kept all %d increments; the timeline cannot show a lost update", acked)
		}
		t.Logf("unfenced reads: %d increments acknowledged, X = %s: one lost", acked, got.Data)
	})
}
