package redis_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/redisstoresuite"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestSuite runs the store's shared suite through go-redis, as
// lock/rueidisfence runs it through rueidis.
func TestSuite(t *testing.T) {
	t.Parallel()
	redisstoresuite.Run(t, redisstoresuite.Target{
		Open: func(t *testing.T, opts ...fkredis.Option) (*fkredis.Store, redis.UniversalClient) {
			c := testenv.Redis(t)
			s, err := fkredis.New(c, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return s, c
		},
	})
}
