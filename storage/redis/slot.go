package redis

import (
	"strconv"
	"strings"
	"sync"
)

// slotTag returns a short hash tag that puts a key in key's Redis Cluster
// slot: "{" + slotTag(key) + "}" followed by anything hashes like key. It is
// the smallest decimal number that hashes to that slot, at most five
// characters whatever key's length.
func slotTag(key string) string {
	return slotTags()[keySlot(hashedPart(key))]
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
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc & 16383
}

// crcTable holds the CRC16 of every byte, for keySlot.
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

// slotTags maps each slot to the smallest decimal number that hashes to it,
// built once, on first use.
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
