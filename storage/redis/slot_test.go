package redis

import "testing"

func TestKeySlot(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]uint16{
		"123456789": 0x31c3 & 16383, // CRC16/XMODEM's check value
		"foo":       12182,
		"bar":       5061,
		"":          0,
	} {
		if got := keySlot(s); got != want {
			t.Errorf("keySlot(%q) = %d; want %d", s, got, want)
		}
	}
	for _, k := range []string{"plain", "p:{user42}:cart", "a}b", "x{}y", "{}", "open{", "}{", "{{t}}"} {
		rk := recordKey(k, "fkr:id:1")
		if got, want := keySlot(hashedPart(rk)), keySlot(hashedPart(k)); got != want {
			t.Errorf("record key %q in slot %d; its value key %q is in %d", rk, got, k, want)
		}
		if len(rk) > len("{16383}fkr:id:1") {
			t.Errorf("record key %q is longer than a slot tag needs", rk)
		}
	}
}
