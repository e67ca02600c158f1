package integration_test

// Redlock against redsync's Redlock on the same private masters.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// BenchmarkRedlockPaired takes and releases a lock over N private masters
// with fencekit's NewRedlock and with redsync, alternating the two in one
// loop so that both see the same machine load. It reports each one's time
// per acquire+release and their ratio (fencekit/redsync). fencekit's
// acquisition also issues a token on every node and raises the lower nodes'
// token state to the largest, a second parallel round trip that redsync
// does not make.
//
//	go test -run '^$' -bench RedlockPaired -benchtime 2000x -count 3 ./internal/integration/
func BenchmarkRedlockPaired(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			ctx := context.Background()
			var (
				clients []redis.UniversalClient
				pools   []rsredis.Pool
			)
			for range n {
				srv := testenv.StartRedis(b)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
				b.Cleanup(func() { _ = c.Close() })
				clients = append(clients, c)
				pools = append(pools, rsgoredis.NewPool(c))
			}
			l, err := lock.NewRedlock(clients)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(l.Close)
			m := redsync.New(pools...).NewMutex("bench-redsync", redsync.WithExpiry(10*time.Second), redsync.WithTries(1))
			var ours, theirs time.Duration
			for b.Loop() {
				start := time.Now()
				lease, err := l.TryAcquire(ctx, "bench-fencekit", 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := m.LockContext(ctx); err != nil {
					b.Fatal(err)
				}
				if ok, err := m.UnlockContext(ctx); !ok || err != nil {
					b.Fatal(ok, err)
				}
				ours += mid.Sub(start)
				theirs += time.Since(mid)
			}
			b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "fencekit-ns/op")
			b.ReportMetric(float64(theirs.Nanoseconds())/float64(b.N), "redsync-ns/op")
			b.ReportMetric(float64(ours)/float64(theirs), "fencekit/redsync")
		})
	}
}
