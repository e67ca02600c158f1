package redis

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"sync/atomic"
)

// recordKey returns the key of the retry record of the call with id id on
// the value key vkey. It lies in vkey's Redis Cluster slot, so one script
// touches both, and no value key can take it: value keys start with a
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

// sendCount is a script argument that counts how many times go-redis wrote
// the script's command to a connection: go-redis marshals an argument that
// implements encoding.BinaryMarshaler each time it writes the command, first
// send and retries alike. A call whose command was never written cannot
// have run.
type sendCount struct {
	n    atomic.Int32
	text []byte
}

func newSendCount(ms int64) *sendCount {
	return &sendCount{text: strconv.AppendInt(nil, ms, 10)}
}

// MarshalBinary returns the argument's text and counts one send.
func (c *sendCount) MarshalBinary() ([]byte, error) {
	c.n.Add(1)
	return c.text, nil
}

// sends returns how many times the command was written.
func (c *sendCount) sends() int { return int(c.n.Load()) }
