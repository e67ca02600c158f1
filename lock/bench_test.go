package lock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

func benchLocker(b *testing.B) (*lock.Locker, *redis.Client) {
	c := testenv.Redis(b)
	l, err := lock.New(c, lock.WithPrefix(testenv.Prefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	return l, c
}

// BenchmarkTryAcquireRelease is one uncontended grant and release: two round
// trips, the floor for a lock with a token.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	l, _ := benchLocker(b)
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.TryAcquire(ctx, "bench", time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTryAcquireReleaseParallel grants and releases distinct resources
// from parallel goroutines: throughput without contention.
func BenchmarkTryAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	l, _ := benchLocker(b)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		resource := "bench-" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			lease, err := l.TryAcquire(ctx, resource, time.Second)
			if err != nil {
				b.Error(err)
				return
			}
			if err := lease.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRoundTripFloor is two plain commands (SET NX PX, DEL): what the
// lock costs at the least, for comparison.
func BenchmarkRoundTripFloor(b *testing.B) {
	ctx := context.Background()
	c := testenv.Redis(b)
	key := testenv.Prefix(b) + "floor"
	b.ReportAllocs()
	for b.Loop() {
		if err := c.SetNX(ctx, key, "v", time.Second).Err(); err != nil {
			b.Fatal(err)
		}
		if err := c.Del(ctx, key).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPairedFloor alternates one grant-and-release with one SET NX PX
// plus DEL on the same connection pool, so that both see the same load, and
// reports each one's time and their ratio. On a shared machine this is a
// fairer comparison than two separate benchmarks.
func BenchmarkPairedFloor(b *testing.B) {
	ctx := context.Background()
	l, c := benchLocker(b)
	key := testenv.Prefix(b) + "floor"
	var lockNs, floorNs time.Duration
	for b.Loop() {
		t0 := time.Now()
		lease, err := l.TryAcquire(ctx, "bench", time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := c.SetNX(ctx, key, "v", time.Second).Err(); err != nil {
			b.Fatal(err)
		}
		if err := c.Del(ctx, key).Err(); err != nil {
			b.Fatal(err)
		}
		lockNs += t1.Sub(t0)
		floorNs += time.Since(t1)
	}
	b.ReportMetric(float64(lockNs.Nanoseconds())/float64(b.N), "lock-ns/op")
	b.ReportMetric(float64(floorNs.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(lockNs)/float64(floorNs), "lock/floor")
}

// BenchmarkTryAcquireReleaseDeadline is BenchmarkTryAcquireRelease with a
// context that has a deadline, on a client made with
// ContextTimeoutEnabled: such a client ends its reads by the deadline
// itself, so the calls go to it directly. The "default" case is a client
// made with default options, whose calls each run in a goroutine so that
// the caller can return by the deadline.
func BenchmarkTryAcquireReleaseDeadline(b *testing.B) {
	for _, tc := range []struct {
		name    string
		honours bool
	}{{"context_timeout", true}, {"default", false}} {
		b.Run(tc.name, func(b *testing.B) {
			opt, err := redis.ParseURL(testenv.RedisURL(b))
			if err != nil {
				b.Fatal(err)
			}
			opt.ContextTimeoutEnabled = tc.honours
			c := redis.NewClient(opt)
			b.Cleanup(func() { _ = c.Close() })
			l, err := lock.New(c, lock.WithPrefix(testenv.Prefix(b)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(l.Close)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			b.ReportAllocs()
			for b.Loop() {
				lease, err := l.TryAcquire(ctx, "bench", time.Second)
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
