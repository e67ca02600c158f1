// Package keyslot computes Redis Cluster's hash slot of a key and short hash
// tags that put other keys in the same slot, for the lock's fence records and
// the Redis store's version records.
//
// It follows the cluster specification: the slot is the CRC16 (XMODEM
// variant, polynomial 0x1021) of the key's hashed part, modulo 16384, where
// the hashed part is the content of the first '{' ... '}' pair when that is
// not empty, else the whole key.
package keyslot
