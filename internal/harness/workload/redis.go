package workload

import (
	"context"
	"errors"

	"github.com/fencekit/fencekit/fence"
	fkredis "github.com/fencekit/fencekit/storage/redis"
	"github.com/redis/go-redis/v9"
)

// RedisCounter keeps counters in Redis: in a [fkredis.Store] (fenced modes,
// the key being the resource) or in plain string keys (Plain mode).
type RedisCounter struct {
	Client redis.UniversalClient
	Store  *fkredis.Store
	// PlainPrefix prefixes the plain keys of Plain mode.
	PlainPrefix string
}

// Name names the storage.
func (c *RedisCounter) Name() string { return "redis" }

// Setup needs to do nothing: a missing counter reads as zero.
func (c *RedisCounter) Setup(context.Context, Mode, []string) error { return nil }

// Read is Store.FencedGet in Fenced mode, Store.Load with UnfencedReads, GET in
// Plain mode.
func (c *RedisCounter) Read(ctx context.Context, mode Mode, f fence.Fence, resource string) (State, error) {
	var (
		v   fkredis.Value
		err error
	)
	switch mode {
	case Plain:
		b, err := c.Client.Get(ctx, c.PlainPrefix+resource).Bytes()
		if errors.Is(err, redis.Nil) {
			return State{}, nil
		}
		if err != nil {
			return State{}, err
		}
		return ParseState(b)
	case UnfencedReads:
		v, err = c.Store.Load(ctx, resource)
	default:
		v, err = c.Store.FencedGet(ctx, f, resource)
	}
	if errors.Is(err, fence.ErrNotFound) {
		return State{}, nil
	}
	if err != nil {
		return State{}, err
	}
	return ParseState(v.Data)
}

// Write is Store.FencedSet in the fenced modes and SET in Plain mode.
func (c *RedisCounter) Write(ctx context.Context, mode Mode, f fence.Fence, resource string, s State) error {
	if mode == Plain {
		return c.Client.Set(ctx, c.PlainPrefix+resource, s.String(), 0).Err()
	}
	_, err := c.Store.FencedSet(ctx, f, resource, []byte(s.String()))
	return err
}

// Final reads the counter without a fence.
func (c *RedisCounter) Final(ctx context.Context, mode Mode, resource string) (State, error) {
	if mode == Plain {
		return c.Read(ctx, Plain, fence.Fence{}, resource)
	}
	return c.Read(ctx, UnfencedReads, fence.Fence{}, resource)
}
