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
		switch b := l.b.(type) {
		case *redisBackend:
			return []redis.UniversalClient{b.client}, 1
		case *redlock:
			clients := make([]redis.UniversalClient, len(b.nodes))
			for i, n := range b.nodes {
				clients[i] = n.client
			}
			return clients, b.quorum
		}
		return nil, 0
	}
}
