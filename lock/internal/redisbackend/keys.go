package redisbackend

import (
	"strings"

	"github.com/fencekit/fencekit/internal/keyslot"
)

// SlotTag returns a string without '}' that Redis Cluster hashes to key's
// slot when it is used as a hash tag. It is key's own tag, or key itself,
// when that can be wrapped in braces; otherwise (a key containing '}' but no
// non-empty tag) a short string with the same slot.
func SlotTag(key string) string {
	h := hashed(key)
	if !strings.Contains(h, "}") {
		return h
	}
	return keyslot.Tag(keySlot(h))
}

// hashed returns the part of key that Redis Cluster hashes: the content of
// the first '{' ... '}' pair if it is not empty, else the whole key.
func hashed(key string) string { return keyslot.HashedPart(key) }

// keySlot is Redis Cluster's slot of a hashed string: CRC16 (XMODEM) mod 16384.
func keySlot(s string) uint16 { return keyslot.Hash(s) }
