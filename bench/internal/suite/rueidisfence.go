package suite

import (
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/rueidisfence"
)

// FencekitRueidis is fencekit's lock on a rueidis client (the module
// lock/rueidisfence): the same scripts and Locker as on go-redis, measured
// against rueidislock, which shares its client.
const FencekitRueidis = "fencekit on rueidis"

func newFencekitRueidis(addr, prefix string) (Locker, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		return nil, err
	}
	n := new(atomic.Int64)
	l, err := rueidisfence.New(countingRueidis{Client: c, n: n}, lock.WithPrefix(prefix))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &fencekitLocker{l: l, closeClient: c.Close, n: n}, nil
}
