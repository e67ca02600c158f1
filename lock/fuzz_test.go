package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// FuzzParseGrant: a release message that parseGrant accepts has the form
// "<holder> <token> <refreshed µs> <age ms>", a token of at least 1 and an
// age that is what the message says, never negative; the same grant written
// out again reads back the same.
func FuzzParseGrant(f *testing.F) {
	f.Add("0123456789abcdef0123456789abcdef 1795452310609617 1795452310600000 3")
	f.Add("")
	f.Add("h 0 1 2")
	f.Add("h 1 2 -3")
	f.Add("h 1 2 3 4")
	f.Add(" 1 2 3")
	f.Add("h 9007199254740991 0 2999")
	f.Fuzz(func(t *testing.T, payload string) {
		holder, g, ok := parseGrant(payload)
		if !ok {
			return
		}
		parts := strings.SplitN(payload, " ", 4)
		if len(parts) != 4 || parts[0] != holder {
			t.Fatalf("parseGrant(%q) accepted holder %q", payload, holder)
		}
		ms, err := strconv.ParseInt(parts[3], 10, 64)
		if err != nil || g.token < 1 || g.age < 0 || g.age != time.Duration(ms)*time.Millisecond || ms > math.MaxInt64/int64(time.Millisecond) {
			t.Fatalf("parseGrant(%q) = token %d, age %v (from %q ms): want a token of at least 1 and the age the message says", payload, g.token, g.age, parts[3])
		}
		again := fmt.Sprintf("%s %d %d %d", holder, g.token, g.ref, g.age.Milliseconds())
		h2, g2, ok2 := parseGrant(again)
		if !ok2 || h2 != holder || g2 != g {
			t.Fatalf("parseGrant(%q) = %q %+v, but its rewrite %q reads %q %+v %v", payload, holder, g, again, h2, g2, ok2)
		}
	})
}

// FuzzParseAcquire: parseAcquire accepts exactly the replies acquire.lua
// documents, {0, ms[, µs[, place]]}, {1, token[, 1]}, {2, token, holder} and
// {3, token, ms}, replaces the holder only on a re-entry, and gives a place
// only to a queued refusal that names one (a number).
func FuzzParseAcquire(f *testing.F) {
	f.Add(uint8(2), int64(0), int64(30), int64(0), "", uint8(0))
	f.Add(uint8(3), int64(1), int64(17), int64(1), "", uint8(0))
	f.Add(uint8(3), int64(2), int64(17), int64(0), "holder", uint8(1))
	f.Add(uint8(3), int64(3), int64(17), int64(40), "", uint8(0))
	f.Add(uint8(2), int64(3), int64(17), int64(40), "", uint8(0))
	f.Add(uint8(4), int64(0), int64(1), int64(2), "x", uint8(2))
	f.Add(uint8(4), int64(0), int64(1), int64(2), "x", uint8(0))
	f.Add(uint8(4), int64(0), int64(1), int64(2), "x", uint8(8))
	f.Fuzz(func(t *testing.T, n uint8, kind, num, third int64, str string, shape uint8) {
		// shape picks each element's type: bit i set makes element i a string.
		vals := []any{kind, num, third, third + 1}
		var raw []any
		for i := range min(int(n), 5) {
			var v any = str
			if i < len(vals) {
				v = vals[i]
				if shape&(1<<i) != 0 {
					v = fmt.Sprint(v)
				}
				if i >= 2 && shape&(1<<i) != 0 {
					v = str
				}
			}
			raw = append(raw, v)
		}
		holder := "mine"
		k, gotN, gotThird, place, err := parseAcquire(raw, &holder)
		want := func() bool {
			if len(raw) < 2 || len(raw) > 4 {
				return false
			}
			k0, ok0 := raw[0].(int64)
			_, ok1 := raw[1].(int64)
			if !ok0 || !ok1 || k0 < 0 || k0 > 3 || len(raw) == 4 && k0 != 0 {
				return false
			}
			switch {
			case k0 == 2:
				_, s := raw[len(raw)-1].(string)
				return len(raw) == 3 && s
			case len(raw) >= 3:
				_, i := raw[2].(int64)
				return i
			}
			return k0 != 3
		}()
		if (err == nil) != want {
			t.Fatalf("parseAcquire(%#v) = %v, want accepted=%v", raw, err, want)
		}
		if err != nil {
			if holder != "mine" {
				t.Fatalf("parseAcquire(%#v) refused but changed the holder to %q", raw, holder)
			}
			return
		}
		if k != raw[0].(int64) || gotN != raw[1].(int64) {
			t.Fatalf("parseAcquire(%#v) = %d, %d", raw, k, gotN)
		}
		wantPlace := int64(-1)
		if len(raw) == 4 {
			if p, ok := raw[3].(int64); ok {
				wantPlace = p
			}
		}
		switch {
		case k == 2 && holder != raw[2].(string):
			t.Fatalf("re-entry %#v: holder %q", raw, holder)
		case k != 2 && holder != "mine":
			t.Fatalf("parseAcquire(%#v) changed the holder to %q", raw, holder)
		case k != 2 && len(raw) >= 3 && gotThird != raw[2].(int64):
			t.Fatalf("parseAcquire(%#v): third %d", raw, gotThird)
		case place != wantPlace:
			t.Fatalf("parseAcquire(%#v): place %d, want %d", raw, place, wantPlace)
		}
	})
}

// FuzzFenceKey: a foreign lock key's fence record sits in the lock key's
// Redis Cluster slot whatever braces the key holds, and distinct keys get
// distinct records.
func FuzzFenceKey(f *testing.F) {
	f.Add("lock", "other")
	f.Add("{user42}:lock", "{user42}:lock2")
	f.Add("a}b", "}")
	f.Add("{}x", "x{}")
	f.Add("{{a}}", "{a}")
	b := &redisBackend{prefix: DefaultPrefix}
	l := &Locker{b: b, names: b}
	f.Fuzz(func(t *testing.T, key, other string) {
		if key == "" {
			return // FenceLock refuses an empty lock key
		}
		tag := slotTag(key)
		if strings.Contains(tag, "}") {
			t.Fatalf("slotTag(%q) = %q holds a brace", key, tag)
		}
		fk := fenceKey(l, key)
		if got, want := keySlot(hashed(fk)), keySlot(hashed(key)); got != want {
			t.Fatalf("FenceKey(%q) = %q is in slot %d, the key in %d", key, fk, got, want)
		}
		if key != other && fk == fenceKey(l, other) {
			t.Fatalf("keys %q and %q share fence record %q", key, other, fk)
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

// FuzzTokenState: whatever a resource's token state holds, a grant either
// takes a token above the state's counter, or is refused with errWrongType
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
		case errors.Is(err, errWrongType) || errors.Is(err, ErrTokensExhausted):
			if errors.Is(err, errWrongType) && valid {
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
