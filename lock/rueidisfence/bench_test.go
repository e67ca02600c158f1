package rueidisfence

import (
	"context"
	"testing"
	"time"

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
