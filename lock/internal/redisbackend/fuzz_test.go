package redisbackend

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/keyslot"
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
	b := &redisBackend{prefix: "fencekit:"}
	f.Fuzz(func(t *testing.T, key, other string) {
		if key == "" {
			return // FenceLock refuses an empty lock key
		}
		tag := SlotTag(key)
		if strings.Contains(tag, "}") {
			t.Fatalf("slotTag(%q) = %q holds a brace", key, tag)
		}
		fk := b.FenceKey(key)
		if got, want := keyslot.Hash(keyslot.HashedPart(fk)), keyslot.Hash(keyslot.HashedPart(key)); got != want {
			t.Fatalf("FenceKey(%q) = %q is in slot %d, the key in %d", key, fk, got, want)
		}
		if key != other && fk == b.FenceKey(other) {
			t.Fatalf("keys %q and %q share fence record %q", key, other, fk)
		}
	})
}
