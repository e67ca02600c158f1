package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

// goRedis is the Client of a go-redis client: a *redis.Client, a
// *redis.ClusterClient, a *redis.Ring or any other UniversalClient.
type goRedis struct {
	c       redis.UniversalClient
	honours bool
	cluster bool
	ring    bool
	dials   *dialWatch // set by watch, for Redlock's nodes only
}

// GoRedis returns the Client of c.
func GoRedis(c redis.UniversalClient) Client { return goRedisOf(c) }

func goRedisOf(c redis.UniversalClient) *goRedis {
	g := &goRedis{c: c, honours: rediscall.HonoursDeadlines(c)}
	switch c.(type) {
	case *redis.ClusterClient:
		g.cluster = true
	case *redis.Ring:
		g.ring = true
	}
	return g
}

func (g *goRedis) Run(ctx context.Context, src string, args []any) Reply {
	cmd := g.c.Do(ctx, args...)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", src
		cmd = g.c.Do(ctx, args...)
	}
	return cmd
}

func (g *goRedis) HonoursDeadlines() bool { return g.honours }

func (g *goRedis) Sharded() bool { return g.cluster }

func (g *goRedis) PerChannel() bool { return g.ring }

func (g *goRedis) IDs() []any {
	ids := []any{g.c}
	if cl, ok := g.c.(*redis.Client); ok {
		o := cl.Options()
		ids = append(ids, fmt.Sprintf("%s/%d", o.Addr, o.DB))
	}
	return ids
}

func (g *goRedis) DialFailure() error { return g.dials.failure() }

// watch adds the dial watch (redlock_errors.go) that DialFailure reads.
func (g *goRedis) watch() { g.dials = watchDials(g.c) }

func (g *goRedis) NewPubSub() PubSub {
	p := &goRedisPubSub{g: g}
	switch c := g.c.(type) {
	case *redis.ClusterClient:
		p.ps = c.SSubscribe(context.Background())
	case *redis.Ring:
		// A Ring routes a PubSub by its first channel, so it can only make
		// one that subscribes at once: the first Subscribe makes it.
	default:
		p.ps = g.c.Subscribe(context.Background())
	}
	return p
}

func (g *goRedis) Listen(ctx context.Context, channel string) <-chan string {
	var ps *redis.PubSub
	if g.cluster {
		ps = g.c.SSubscribe(ctx, channel)
	} else {
		ps = g.c.Subscribe(ctx, channel)
	}
	out := make(chan string)
	go func() {
		defer close(out)
		defer ps.Close()
		ch := ps.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				select {
				case out <- m.Payload:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// goRedisPubSub is a go-redis PubSub; on a Ring it is made by the first
// Subscribe.
type goRedisPubSub struct {
	g      *goRedis
	mu     sync.Mutex // guards ps and closed on a Ring
	ps     *redis.PubSub
	closed bool
}

func (p *goRedisPubSub) pubSub() *redis.PubSub {
	if !p.g.ring {
		return p.ps
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ps
}

// errNoShard is a Ring's first subscribe that found no shard to go to.
var errNoShard = errors.New("redis: the Ring has no shard for the channel")

func (p *goRedisPubSub) Subscribe(ctx context.Context, channel string) error {
	if p.g.ring {
		if ps := p.pubSub(); ps != nil {
			return ps.Subscribe(ctx, channel)
		}
		ps := ringSubscribe(ctx, p.g.c, channel)
		if ps == nil {
			return errNoShard
		}
		p.mu.Lock()
		dead := p.closed
		if !dead {
			p.ps = ps
		}
		p.mu.Unlock()
		if dead {
			_ = ps.Close()
		}
		return nil
	}
	if p.g.cluster {
		return p.ps.SSubscribe(ctx, channel)
	}
	return p.ps.Subscribe(ctx, channel)
}

// ringSubscribe subscribes channel on a new PubSub of the Ring's shard for
// it, or returns nil when the Ring has no shard to give (it panics then,
// rather than return an error).
func ringSubscribe(ctx context.Context, c redis.UniversalClient, channel string) (ps *redis.PubSub) {
	defer func() {
		if recover() != nil {
			ps = nil
		}
	}()
	return c.Subscribe(ctx, channel)
}

func (p *goRedisPubSub) Unsubscribe(ctx context.Context, channel string) error {
	ps := p.pubSub()
	switch {
	case ps == nil:
		return errNoShard
	case p.g.cluster:
		return ps.SUnsubscribe(ctx, channel)
	}
	return ps.Unsubscribe(ctx, channel)
}

func (p *goRedisPubSub) Receive(timeout time.Duration) (Event, error) {
	ps := p.pubSub()
	if ps == nil {
		return Event{}, errNoShard // a Ring's first subscribe failed
	}
	msg, err := ps.ReceiveTimeout(context.Background(), timeout)
	if err != nil {
		if isTimeout(err) {
			return Event{}, nil
		}
		return Event{}, err
	}
	switch m := msg.(type) {
	case *redis.Subscription:
		switch m.Kind {
		case "subscribe", "ssubscribe":
			return Event{Kind: EventSubscribe, Channel: m.Channel}, nil
		case "unsubscribe", "sunsubscribe":
			return Event{Kind: EventUnsubscribe, Channel: m.Channel}, nil
		}
	case *redis.Message:
		return Event{Kind: EventMessage, Channel: m.Channel, Payload: m.Payload}, nil
	}
	return Event{Kind: EventOther}, nil
}

// isTimeout reports whether err is a read that timed out. It is apart from
// Receive so that its net.Error, which errors.As moves to the heap, is
// allocated only on an error, not for every message received.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (p *goRedisPubSub) Ping(ctx context.Context) error {
	ps := p.pubSub()
	if ps == nil {
		return errNoShard
	}
	return ps.Ping(ctx)
}

func (p *goRedisPubSub) Close() error {
	if !p.g.ring {
		return p.ps.Close()
	}
	p.mu.Lock()
	p.closed = true
	ps := p.ps
	p.mu.Unlock()
	if ps != nil {
		return ps.Close()
	}
	return nil
}
