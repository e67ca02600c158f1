package redis

import (
	"fmt"
	"reflect"

	goredis "github.com/redis/go-redis/v9"
)

// errRing is why [New] refuses a *goredis.Ring. A Ring moves the keys of a
// shard it has marked down (a few missed heartbeats) to the other shards,
// and back once the shard answers again. The shard a key moves to holds no
// high-water mark for it, so it admits any fence, a stale one included, and
// two shards can hold two versions of one value. No script can see this: each
// runs on one shard and finds what that shard holds.
const errRing = "a *redis.Ring cannot keep fenced values: when it marks a shard down it sends that shard's keys to another shard, which holds no high-water mark for them and admits stale fences; use a *redis.Client (with Sentinel for failover) or a *redis.ClusterClient, whose keys move only with their data"

// ringType is the type New refuses.
var ringType = reflect.TypeFor[*goredis.Ring]()

// refuseRing returns an error when client is a *goredis.Ring, or a wrapper
// that holds one in a field (a few levels deep, through pointers, interfaces
// and structs), as a client of one's own that adds tracing would.
func refuseRing(client goredis.Scripter) error {
	if holdsRing(reflect.ValueOf(client), 0) {
		return fmt.Errorf("%w: %s", errInvalidOption, errRing)
	}
	return nil
}

// maxWrapDepth bounds how deep holdsRing looks into a wrapper: enough for a
// struct that holds a client, or a pointer to one, without walking a
// client's own internals.
const maxWrapDepth = 4

func holdsRing(v reflect.Value, depth int) bool {
	if !v.IsValid() || depth > maxWrapDepth {
		return false
	}
	switch v.Kind() {
	case reflect.Interface:
		return !v.IsNil() && holdsRing(v.Elem(), depth)
	case reflect.Pointer:
		switch v.Type() {
		case ringType:
			return true
		case reflect.TypeFor[*goredis.Client](), reflect.TypeFor[*goredis.ClusterClient]():
			return false // each key has one home; nothing to look for inside
		}
		return !v.IsNil() && holdsRing(v.Elem(), depth+1)
	case reflect.Struct:
		for i := range v.NumField() {
			if holdsRing(v.Field(i), depth+1) {
				return true
			}
		}
	}
	return false
}
