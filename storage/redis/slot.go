package redis

import "github.com/fencekit/fencekit/internal/keyslot"

// slotTag returns a short hash tag that puts a key in key's Redis Cluster
// slot: "{" + slotTag(key) + "}" followed by anything hashes like key. It is
// the smallest decimal number that hashes to that slot, at most six
// characters whatever key's length.
func slotTag(key string) string {
	return keyslot.Tag(keyslot.Of(key))
}
