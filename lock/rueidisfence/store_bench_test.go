package rueidisfence

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// BenchmarkStore is a fenced read and a fenced write of a 32-byte value,
// through go-redis (fkredis.New) and through rueidis (NewStore), one after
// the other in the same run on the shared server: what the rueidis client
// costs against go-redis's on the same scripts.
//
//	go test -run '^$' -bench Store -benchmem ./lock/rueidisfence/
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	prefix := testenv.Prefix(b) + "store-"
	gs, err := fkredis.New(testenv.Redis(b), fkredis.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	rs := newStore(b, rueidisClient(b, sharedAddr(b)), fkredis.WithPrefix(prefix))
	f, v := fence.Fence{Resource: "bench", Token: 1, Holder: "bench"}, []byte("0123456789abcdef0123456789abcdef")
	for _, c := range []struct {
		name string
		s    *fkredis.Store
	}{{"go-redis", gs}, {"rueidis", rs}} {
		if err := c.s.Preload(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := c.s.FencedSet(ctx, f, "k", v); err != nil {
			b.Fatal(err)
		}
		b.Run("FencedGet/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.s.FencedGet(ctx, f, "k"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("FencedSet/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.s.FencedSet(ctx, f, "k", v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
