package rueidisfence

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// BenchmarkTryAcquireRelease is the uncontended pair on one resource,
// through go-redis and through rueidis, one after the other in the same
// run on the shared server: what the rueidis client costs against
// go-redis's on the same scripts.
//
//	go test -run '^$' -bench TryAcquireRelease -benchmem ./lock/rueidisfence/
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	prefix := testenv.Prefix(b)
	gl, err := lock.New(testenv.Redis(b), lock.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	defer gl.Close()
	rl, err := New(rueidisClient(b, sharedAddr(b)), lock.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	defer rl.Close()
	for _, c := range []struct {
		name string
		l    *lock.Locker
	}{{"go-redis", gl}, {"rueidis", rl}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				lease, err := c.l.TryAcquire(ctx, "bench", 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAgainstRueidislock is the uncontended pair on one resource
// through rueidis: this package's Locker (a grant with its fencing token,
// then the release) and rueidislock's (TryWithContext, then the cancel
// that releases; no token), one after the other in the same run on the
// shared server. rueidislock is set as the peer benchmark in bench/ sets
// it: one key (KeyMajority 1), no client-side caching of the lock key.
//
//	go test -run '^$' -bench AgainstRueidislock -benchmem ./lock/rueidisfence/
func BenchmarkAgainstRueidislock(b *testing.B) {
	ctx := context.Background()
	prefix := testenv.Prefix(b)
	rl, err := New(rueidisClient(b, sharedAddr(b)), lock.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	defer rl.Close()
	peer, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{sharedAddr(b)}, DisableCache: true},
		KeyPrefix:    prefix + "rueidislock", KeyMajority: 1, NoLoopTracking: true, TryNextAfter: time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	b.Run("rueidisfence", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lease, err := rl.TryAcquire(ctx, "bench", 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rueidislock", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, cancel, err := peer.TryWithContext(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			cancel()
		}
	})
}
