package keyslot

import (
	"strconv"
	"strings"
	"sync"
)

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Of returns key's Redis Cluster slot, as CLUSTER KEYSLOT reports it.
func Of(key string) uint16 {
	return Hash(HashedPart(key))
}

// HashedPart returns the part of key that Redis Cluster hashes: the content
// of the first '{' ... '}' pair when it is not empty, else the whole key.
// The result holds no hash tag of its own, so HashedPart(HashedPart(k)) is
// HashedPart(k).
func HashedPart(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key[open+1 : open+1+n]
		}
	}
	return key
}

// Hash returns the slot of a string that is hashed whole, hash tags and all:
// its CRC16 modulo 16384.
func Hash(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc & (Slots - 1)
}

// Tag returns the smallest decimal number that hashes to slot, so that
// "{" + Tag(slot) + "}" followed by anything is in slot. It has at most six
// digits (the largest is 109757, for slot 1469). It panics when slot is not below [Slots].
func Tag(slot uint16) string {
	return tags()[slot]
}

// crcTable holds the CRC16 of every byte, for Hash.
var crcTable = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

// tags maps each slot to its Tag, built once, on first use.
var tags = sync.OnceValue(func() *[Slots]string {
	var t [Slots]string
	for i, left := 0, len(t); left > 0; i++ {
		s := strconv.Itoa(i)
		if slot := Hash(s); t[slot] == "" {
			t[slot] = s
			left--
		}
	}
	return &t
})
