package lock

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// FuzzTokenState: whatever a resource's token state holds, a grant either
// takes a token above the state's counter, or is refused with fence.ErrWrongType
// (or ErrTokensExhausted at the top) and leaves the state and the lock as
// they were; what the state can hold is what tokenstate.lua says. Runs
// against the real Redis server.
func FuzzTokenState(f *testing.F) {
	for _, s := range []string{"", "7", "7 abcdefgh", "7 5 abcdefgh", "9007199254740991", "9007199254740990 h",
		"0000000000000001 h", "12 34", "1 2 3 4", "x", "-1", "1e5", "7 \x00", "7 ab\tcd", "99999999999999999"} {
		f.Add(s)
	}
	c := testenv.Redis(f)
	prefix := testenv.Prefix(f)
	l, err := New(c, WithPrefix(prefix), WithWait(Backoff(0, 0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(l.Close)
	var seq int
	f.Fuzz(func(t *testing.T, state string) {
		seq++
		resource := "r" + strconv.Itoa(seq)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tokenKey, lockKey := keysOf(l).TokenKey(resource), keysOf(l).LockKey(resource)
		defer c.Del(context.Background(), tokenKey, lockKey)
		if state != "" {
			if err := c.Set(ctx, tokenKey, state, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
		n, valid := tokenStateSpec(state)
		if state == "" {
			n, valid = 0, true // no state at all
		}
		lease, err := l.TryAcquire(ctx, resource, time.Second)
		switch {
		case err == nil:
			if !valid {
				t.Fatalf("state %q is not a token state, but a grant took token %d from it", state, lease.Fence().Token)
			}
			if lease.Fence().Token <= fence.Token(n) || lease.Fence().Token > fence.MaxToken {
				t.Fatalf("state %q (counter %d): granted token %d", state, n, lease.Fence().Token)
			}
			after, err := c.Get(ctx, tokenKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n2, ok := tokenStateSpec(after); !ok || n2 != int64(lease.Fence().Token) {
				t.Fatalf("after a grant of token %d from %q, the state is %q", lease.Fence().Token, state, after)
			}
		case errors.Is(err, fence.ErrWrongType) || errors.Is(err, ErrTokensExhausted):
			if errors.Is(err, fence.ErrWrongType) && valid {
				t.Fatalf("state %q (counter %d) refused: %v", state, n, err)
			}
			if errors.Is(err, ErrTokensExhausted) && (!valid || fence.Token(n) < fence.MaxToken) {
				t.Fatalf("state %q refused as exhausted: %v", state, err)
			}
			after, err2 := c.Get(ctx, tokenKey).Result()
			if err2 != nil || after != state {
				t.Fatalf("refused (%v), but the state %q became %q (%v)", err, state, after, err2)
			}
			if k, _ := c.Exists(ctx, lockKey).Result(); k != 0 {
				t.Fatalf("refused (%v), but the lock was taken", err)
			}
		default:
			t.Fatalf("state %q: %v", state, err)
		}
	})
}

// tokenStateSpec is tokenstate.lua's reading of a token state, written out
// again from its comments: "<n> <h>", "<n> <g> <h>" or a bare "<n>", n and
// g decimals of at most 2^53-1 (16 digits at most), h without white space.
var (
	shortState = regexp.MustCompile(`^([0-9]+) ([^ \t\n\v\f\r]+)$`)
	longState  = regexp.MustCompile(`^([0-9]+) ([0-9]+) ([^ \t\n\v\f\r]+)$`)
)

func tokenStateSpec(v string) (n int64, ok bool) {
	isToken := func(s string) bool {
		if s == "" || len(s) > 16 || strings.Trim(s, "0123456789") != "" {
			return false
		}
		return len(s) < 16 || s <= "9007199254740991"
	}
	var ns, gs string
	if m := shortState.FindStringSubmatch(v); m != nil {
		ns = m[1]
	} else if m := longState.FindStringSubmatch(v); m != nil {
		ns, gs = m[1], m[2]
	} else {
		ns = v
	}
	if !isToken(ns) || (gs != "" && !isToken(gs)) {
		return 0, false
	}
	n, _ = strconv.ParseInt(ns, 10, 64)
	return n, true
}
