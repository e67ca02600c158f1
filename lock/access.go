package lock

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/lockaccess"
)

// Packages of this module that keep state next to a resource's lock (the
// election's leader record) reach the Locker's clients through lockaccess,
// so that the lock's public API does not grow a client accessor. They reach
// each client's rediscall.Calls too, so that their calls keep the lock's
// deadline rules (see calls.go) and Close waits for the ones cut short, and
// whether the Locker was closed, since a closed Locker renews nothing.
func init() {
	lockaccess.Clients = func(v any) ([]redis.UniversalClient, int) {
		nodes, quorum, _ := lockaccess.Nodes(v)
		clients := make([]redis.UniversalClient, len(nodes))
		for i, n := range nodes {
			clients[i] = n.Client
		}
		return clients, quorum
	}
	lockaccess.Nodes = func(v any) ([]lockaccess.Node, int, time.Duration) {
		l, ok := v.(*Locker)
		if !ok || l == nil {
			return nil, 0, 0
		}
		switch b := l.b.(type) {
		case *redisBackend:
			return []lockaccess.Node{{Client: b.client, Calls: b.calls}}, 1, 0
		case *redlock:
			nodes := make([]lockaccess.Node, len(b.nodes))
			for i, n := range b.nodes {
				nodes[i] = lockaccess.Node{Client: n.client, Calls: n.calls}
			}
			return nodes, b.quorum, b.timeout
		}
		return nil, 0, 0
	}
	lockaccess.Closed = func(v any) bool {
		l, ok := v.(*Locker)
		if !ok || l == nil {
			return false
		}
		l.renewMu.Lock()
		defer l.renewMu.Unlock()
		return l.closed
	}
}
