package lock

import (
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/lockaccess"
)

// Packages of this module that keep state next to a resource's lock (the
// election's leader record) reach the Locker's clients through lockaccess,
// so that the lock's public API does not grow a client accessor.
func init() {
	lockaccess.Clients = func(v any) ([]redis.UniversalClient, int) {
		l, ok := v.(*Locker)
		if !ok || l == nil {
			return nil, 0
		}
		if l.red == nil {
			return []redis.UniversalClient{l.client}, 1
		}
		clients := make([]redis.UniversalClient, len(l.red.nodes))
		for i, n := range l.red.nodes {
			clients[i] = n.client
		}
		return clients, l.red.quorum
	}
}
