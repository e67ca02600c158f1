package keyslot

import (
	"strconv"
	"testing"
)

// TestOf checks slots against the values CLUSTER KEYSLOT returns for the
// same keys on a Redis 7 cluster node, hash tags and edge cases included.
func TestOf(t *testing.T) {
	for _, c := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 12739}, // CRC16/XMODEM's check value 0x31c3, mod 16384
		{"foo", 12182},
		{"bar", 5061},
		{"", 0},
		{"héllo", 11061},
		{"fencekit:lock:order-42", 14159},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{bar}{zap}", 5061}, // the first tag only
		{"foo{{bar}}zap", 4015}, // tag "{bar"
		{"foo{}{bar}", 8363},    // an empty first tag: the whole key
		{"{}", 15257},
		{"}{", 12793},
		{"a}b", 7866},
		{"x{}y", 16116},
		{"{{t}}", 10928},
		{"open{", 10514},
	} {
		if got := Of(c.key); got != c.want {
			t.Errorf("Of(%q) = %d; want %d", c.key, got, c.want)
		}
	}
}

func TestHashedPart(t *testing.T) {
	for key, want := range map[string]string{
		"plain":         "plain",
		"p:{user42}:c":  "user42",
		"foo{}{bar}":    "foo{}{bar}",
		"foo{{bar}}zap": "{bar",
		"{a}{b}":        "a",
		"}{":            "}{",
		"open{":         "open{",
	} {
		got := HashedPart(key)
		if got != want {
			t.Errorf("HashedPart(%q) = %q; want %q", key, got, want)
		}
		if again := HashedPart(got); again != got {
			t.Errorf("HashedPart(%q) = %q, not idempotent", got, again)
		}
	}
}

// TestTag checks every slot's tag: it hashes to its slot, is the smallest
// decimal number that does, and is at most six characters long.
func TestTag(t *testing.T) {
	first := map[uint16]int{}
	for i := 0; len(first) < Slots; i++ {
		if _, ok := first[Hash(strconv.Itoa(i))]; !ok {
			first[Hash(strconv.Itoa(i))] = i
		}
	}
	for slot := range uint16(Slots) {
		tag := Tag(slot)
		if Of("{"+tag+"}:anything") != slot {
			t.Fatalf("Tag(%d) = %q puts keys in slot %d", slot, tag, Of("{"+tag+"}"))
		}
		if want := strconv.Itoa(first[slot]); tag != want {
			t.Fatalf("Tag(%d) = %q; the smallest number in that slot is %s", slot, tag, want)
		}
		if len(tag) > 6 {
			t.Fatalf("Tag(%d) = %q is longer than six characters", slot, tag)
		}
	}
}
