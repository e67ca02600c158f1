package redis

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"sync/atomic"
)

// recordKey returns the key of the retry record of the call with id id on
// the value key vkey: "{<slot tag>}fkr:<store id>:<sequence>". It lies in
// vkey's Redis Cluster slot, so one script touches both, and its length does
// not grow with vkey's. No value key can take it: value keys start with a
// store's prefix, which holds no brace, and record keys start with one.
func recordKey(vkey, id string) string {
	return "{" + slotTag(vkey) + "}" + id
}

// recordKeyMarker is the text that every retry record key holds right after
// its hash tag ("{...}fkr:..."): SCAN with MATCH "*}fkr:*" finds them.
const recordKeyMarker = "fkr:"

// newStoreID returns the random part of a store's call ids: 64 bits from
// crypto/rand, so that two stores never share a record.
func newStoreID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return recordKeyMarker + base64.RawURLEncoding.EncodeToString(b[:]) + ":"
}

// callID returns an id unique to one call of s.
func (s *Store) callID() string {
	return s.storeID + strconv.FormatUint(s.callSeq.Add(1), 36)
}

// sendCount is the script argument that carries the retry window and
// counts how many times go-redis wrote the script's command to a connection:
// go-redis marshals an argument that implements encoding.BinaryMarshaler each
// time it writes the command, first send and resends alike. A call whose
// command was never written cannot have run.
//
// The first send carries the window as it is; every later one carries it
// negated, which tells the script that the send may repeat one that already
// ran, and only then does the script look for the call's record. A first
// send cannot repeat anything, so it skips that look-up. A client whose
// options could not be read is not known to marshal arguments on every send
// (it might reuse the bytes of the first), so every send of it is marked as a
// possible repeat.
type sendCount struct {
	n            atomic.Int32
	first, later []byte
}

func newSendCount(windowMs int64, known bool) *sendCount {
	later := strconv.AppendInt(nil, -windowMs, 10)
	if !known {
		return &sendCount{first: later, later: later}
	}
	return &sendCount{first: strconv.AppendInt(nil, windowMs, 10), later: later}
}

// MarshalBinary counts one send and returns the window's text for it.
func (c *sendCount) MarshalBinary() ([]byte, error) {
	if c.n.Add(1) == 1 {
		return c.first, nil
	}
	return c.later, nil
}

// sends returns how many times the command was written.
func (c *sendCount) sends() int { return int(c.n.Load()) }
