package redis

import (
	"strconv"
	"strings"
	"sync"
)

// slotTag returns a hash tag that puts a key in key's Redis Cluster slot:
// "{" + slotTag(key) + "}" followed by anything hashes like key. It is the
// part of key that the cluster hashes when that part holds no '}', and
// otherwise a short number that hashes to the same slot.
func slotTag(key string) string {
	h := hashedPart(key)
	if !strings.Contains(h, "}") {
		return h
	}
	return slotTags()[keySlot(h)]
}

// hashedPart returns the part of key that Redis Cluster hashes: the content
// of the first '{' ... '}' pair when it is not empty, else the whole key.
func hashedPart(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key[open+1 : open+1+n]
		}
	}
	return key
}

// keySlot is Redis Cluster's slot of a hashed string: its CRC16 (the XMODEM
// variant, polynomial 0x1021) modulo 16384.
func keySlot(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}

// slotTags maps each slot to the smallest decimal number that hashes to it,
// built once, on the first key whose hashed part holds a '}'.
var slotTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	for i, left := 0, len(tags); left > 0; i++ {
		s := strconv.Itoa(i)
		if slot := keySlot(s); tags[slot] == "" {
			tags[slot] = s
			left--
		}
	}
	return &tags
})
