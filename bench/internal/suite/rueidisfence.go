package suite

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/rueidisfence"
)

// FencekitRueidis is fencekit's lock on a rueidis client (the module
// lock/rueidisfence): the same scripts and Locker as on go-redis, measured
// against rueidislock, which shares its client.
const FencekitRueidis = "fencekit on rueidis"

type fencekitRueidisLocker struct {
	l *lock.Locker
	c rueidis.Client
	n *atomic.Int64
}

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
	return &fencekitRueidisLocker{l: l, c: c, n: n}, nil
}

func (f *fencekitRueidisLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	lease, err := f.l.TryAcquire(ctx, resource, leaseTTL)
	if errors.Is(err, lock.ErrNotAcquired) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return lease, nil
}

func (f *fencekitRueidisLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	lease, err := f.l.Acquire(ctx, resource, leaseTTL)
	if err != nil {
		return nil, err
	}
	return lease, nil
}

func (f *fencekitRueidisLocker) Commands() int64 { return f.n.Load() }
func (f *fencekitRueidisLocker) Close()          { f.l.Close(); f.c.Close() }
