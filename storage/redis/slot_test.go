package redis

import (
	"testing"

	"github.com/fencekit/fencekit/internal/keyslot"
)

// TestRecordKeySlot checks that a version record shares its value key's
// slot, whatever braces the key holds, with a tag no longer than needed.
func TestRecordKeySlot(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"plain", "p:{user42}:cart", "a}b", "x{}y", "{}", "open{", "}{", "{{t}}"} {
		rk := recordKey(k, "fkr:id:1")
		if got, want := keyslot.Of(rk), keyslot.Of(k); got != want {
			t.Errorf("record key %q in slot %d; its value key %q is in %d", rk, got, k, want)
		}
		if len(rk) > len("{109757}fkr:id:1") {
			t.Errorf("record key %q is longer than a slot tag needs", rk)
		}
	}
}
