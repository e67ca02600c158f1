package rueidisfence

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/lock/internal/redisbackend"
)

// client is the Redis backend's command interface on a rueidis client:
// scripts by EVALSHA (EVAL when the server has not seen one), their
// replies read as the backend reads go-redis's, and pub/sub on dedicated
// connections.
type client struct {
	c       rueidis.Client
	cluster bool
	// dial is the latest failed dial a call of this client met, nil once
	// a call got a reply since (see DialFailure).
	dial atomic.Pointer[dialFailure]
	// before, when set (by tests), runs before each script call with the
	// script's hash, keys and arguments; reply, when set, stands in for
	// the reading of each reply (a test's broken adapter).
	before func(hash string, keys, args []string)
	reply  func(res rueidis.RedisResult) redisbackend.Reply
}

func newClient(c rueidis.Client) *client {
	return &client{c: c, cluster: c.Mode() == rueidis.ClientModeCluster}
}

var _ redisbackend.Client = (*client)(nil)

// Run sends args, laid out as EVALSHA takes them, as one EVALSHA command,
// and again as EVAL with src on a NOSCRIPT reply.
func (c *client) Run(ctx context.Context, src string, args []any) redisbackend.Reply {
	hash, _ := args[1].(string)
	n, _ := args[2].(int)
	if n < 0 || 3+n > len(args) {
		return &reply{err: fmt.Errorf("rueidisfence: a script call with %d keys and %d arguments", n, len(args))}
	}
	strs := make([]string, len(args)-3)
	for i, a := range args[3:] {
		var err error
		if strs[i], err = argString(a); err != nil {
			return &reply{err: fmt.Errorf("rueidisfence: script argument %d: %w", i, err)}
		}
	}
	keys, rest := strs[:n], strs[n:]
	if c.before != nil {
		c.before(hash, keys, rest)
	}
	res := c.c.Do(ctx, c.c.B().Evalsha().Sha1(hash).Numkeys(int64(n)).Key(keys...).Arg(rest...).Build())
	if e, ok := rueidis.IsRedisErr(res.Error()); ok && e.IsNoScript() {
		res = c.c.Do(ctx, c.c.B().Eval().Script(src).Numkeys(int64(n)).Key(keys...).Arg(rest...).Build())
	}
	c.noteDial(res.NonRedisError())
	if c.reply != nil {
		return c.reply(res)
	}
	return newReply(res)
}

// argString writes a script argument as go-redis would. A
// BinaryMarshaler is marshalled once, here: rueidis sends the same bytes
// at every send of the command.
func argString(a any) (string, error) {
	switch v := a.(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case *string:
		return *v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case *int64:
		return strconv.FormatInt(*v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	case nil:
		return "", nil
	case encoding.BinaryMarshaler:
		b, err := v.MarshalBinary()
		return string(b), err
	}
	return fmt.Sprint(a), nil
}

// HonoursDeadlines is true: rueidis ends a call when its context ends.
func (c *client) HonoursDeadlines() bool { return true }

func (c *client) Sharded() bool { return c.cluster }

func (c *client) PerChannel() bool { return false }

// IDs is the client, and for a client of one server its address: two
// clients of the same server are one Redlock voter, whatever database
// each selects.
func (c *client) IDs() []any {
	ids := []any{c.c}
	if !c.cluster {
		for addr := range c.c.Nodes() {
			ids = append(ids, addr)
		}
	}
	return ids
}

// dialFailure is a failed dial and when a call met it.
type dialFailure struct {
	at  time.Time
	err error
}

// dialRecency is how old a failed dial may be and still explain a node's
// silence: rueidis dials again on the next call, so an older failure is
// not this call's.
const dialRecency = 5 * time.Second

// noteDial records err, a call's error other than a reply, when it is a
// failed dial, and forgets the last one when the call got a reply.
func (c *client) noteDial(err error) {
	var op *net.OpError
	switch {
	case err == nil:
		if c.dial.Load() != nil {
			c.dial.Store(nil)
		}
	case errors.As(err, &op) && op.Op == "dial":
		c.dial.Store(&dialFailure{at: time.Now(), err: err})
	}
}

// DialFailure is the latest failed dial that a call of this client met,
// if it is recent and no call got a reply since. rueidis hands a dial's
// error to the calls that waited for that dial; a call that its context
// or Redlock's node timeout ended first is told by this one, as go-redis's
// dial watch tells it.
func (c *client) DialFailure() error {
	f := c.dial.Load()
	if f == nil || time.Since(f.at) > dialRecency {
		return nil
	}
	return f.err
}

func (c *client) NewPubSub() redisbackend.PubSub { return c.newPubSub() }

func (c *client) newPubSub() *pubSub {
	return &pubSub{c: c, signal: make(chan struct{}, 1)}
}

func (c *client) Listen(ctx context.Context, channel string) <-chan string {
	out := make(chan string)
	ps := c.newPubSub()
	err := ps.Subscribe(ctx, channel)
	go func() {
		defer close(out)
		defer func() { _ = ps.Close() }()
		failures := 0
		for {
			if err != nil {
				// The connection broke: a new one after a pause that
				// grows with consecutive failures.
				_ = ps.Close()
				failures++
				t := time.NewTimer(min(10*time.Millisecond<<min(failures-1, 7), time.Second))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				ps = c.newPubSub()
				if err = ps.Subscribe(ctx, channel); err != nil {
					continue
				}
			}
			var ev redisbackend.Event
			ev, err = ps.receive(ctx, time.Minute)
			if ctx.Err() != nil {
				return
			}
			if err != nil || ev.Kind != redisbackend.EventMessage {
				continue
			}
			failures = 0
			select {
			case out <- ev.Payload:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// pubSub is a subscription connection: a dedicated rueidis connection,
// made by the first Subscribe, whose pub/sub hooks queue what it receives
// for Receive.
type pubSub struct {
	c      *client
	signal chan struct{} // cap 1: something was queued, or the connection ended

	mu     sync.Mutex
	dc     rueidis.DedicatedClient // nil until the first Subscribe
	closed bool
	ended  error // why the hooks stopped; nil while they run
	queue  []redisbackend.Event
}

// errClosed is a PubSub used after Close.
var errClosed = errors.New("rueidisfence: subscription connection closed")

func (p *pubSub) push(ev redisbackend.Event) {
	p.mu.Lock()
	p.queue = append(p.queue, ev)
	p.mu.Unlock()
	p.kick()
}

func (p *pubSub) kick() {
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

// conn returns the dedicated connection, making it the first time.
func (p *pubSub) conn() (rueidis.DedicatedClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errClosed
	}
	if p.dc != nil {
		return p.dc, nil
	}
	dc, _ := p.c.c.Dedicate() // Close releases it
	ended := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) {
			p.push(redisbackend.Event{Kind: redisbackend.EventMessage, Channel: m.Channel, Payload: m.Message})
		},
		OnSubscription: func(s rueidis.PubSubSubscription) {
			switch s.Kind {
			case "subscribe", "ssubscribe":
				p.push(redisbackend.Event{Kind: redisbackend.EventSubscribe, Channel: s.Channel})
			case "unsubscribe", "sunsubscribe":
				p.push(redisbackend.Event{Kind: redisbackend.EventUnsubscribe, Channel: s.Channel})
			}
		},
	})
	go func() {
		err, ok := <-ended
		if !ok || err == nil {
			err = errClosed
		}
		p.mu.Lock()
		p.ended = err
		p.mu.Unlock()
		p.kick()
	}()
	p.dc = dc
	return dc, nil
}

func (p *pubSub) Subscribe(ctx context.Context, channel string) error {
	dc, err := p.conn()
	if err != nil {
		return err
	}
	if p.c.cluster {
		return dc.Do(ctx, dc.B().Ssubscribe().Channel(channel).Build()).Error()
	}
	return dc.Do(ctx, dc.B().Subscribe().Channel(channel).Build()).Error()
}

func (p *pubSub) Unsubscribe(ctx context.Context, channel string) error {
	dc, err := p.conn()
	if err != nil {
		return err
	}
	if p.c.cluster {
		return dc.Do(ctx, dc.B().Sunsubscribe().Channel(channel).Build()).Error()
	}
	return dc.Do(ctx, dc.B().Unsubscribe().Channel(channel).Build()).Error()
}

func (p *pubSub) Receive(timeout time.Duration) (redisbackend.Event, error) {
	return p.receive(context.Background(), timeout)
}

// receive is Receive, returning early when ctx ends.
func (p *pubSub) receive(ctx context.Context, timeout time.Duration) (redisbackend.Event, error) {
	var t *time.Timer
	for {
		p.mu.Lock()
		if len(p.queue) > 0 {
			ev := p.queue[0]
			p.queue[0] = redisbackend.Event{}
			p.queue = p.queue[1:]
			p.mu.Unlock()
			if t != nil {
				t.Stop()
			}
			return ev, nil
		}
		err := p.ended
		if err == nil && p.closed {
			err = errClosed
		}
		p.mu.Unlock()
		if err != nil {
			return redisbackend.Event{}, err
		}
		if t == nil {
			t = time.NewTimer(timeout)
			defer t.Stop()
		}
		select {
		case <-p.signal:
		case <-t.C:
			return redisbackend.Event{}, nil
		case <-ctx.Done():
			return redisbackend.Event{}, ctx.Err()
		}
	}
}

func (p *pubSub) Ping(ctx context.Context) error {
	dc, err := p.conn()
	if err != nil {
		return err
	}
	return dc.Do(ctx, dc.B().Ping().Build()).Error()
}

func (p *pubSub) Close() error {
	p.mu.Lock()
	dc := p.dc
	already := p.closed
	p.closed, p.dc = true, nil
	p.mu.Unlock()
	if !already && dc != nil {
		dc.Close()
	}
	p.kick()
	return nil
}

// reply is a rueidis result read as the backend reads a go-redis reply.
type reply struct {
	val any
	err error
}

func newReply(res rueidis.RedisResult) *reply {
	msg, err := res.ToMessage()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return &reply{err: redisbackend.Nil}
		}
		if e, ok := rueidis.IsRedisErr(err); ok {
			return &reply{err: replyError(e.Error())}
		}
		return &reply{err: err}
	}
	return &reply{val: value(&msg)}
}

// value converts a message as go-redis does: int64, string, []any, nil.
func value(m *rueidis.RedisMessage) any {
	switch {
	case m.IsNil():
		return nil
	case m.IsInt64():
		n, _ := m.AsInt64()
		return n
	case m.IsString():
		s, _ := m.ToString()
		return s
	case m.IsArray():
		arr, _ := m.ToArray()
		out := make([]any, len(arr))
		for i := range arr {
			out[i] = value(&arr[i])
		}
		return out
	}
	if err := m.Error(); err != nil {
		return replyError(err.Error())
	}
	v, _ := m.ToAny()
	return v
}

// replyError is an error reply: the server refused the command, which had
// no effect. Its RedisError method is how the backend tells it from a
// failure that may have reached the server (as go-redis's redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }

func (replyError) RedisError() {}

func (r *reply) Err() error { return r.err }

func (r *reply) Val() any { return r.val }

func (r *reply) Result() (any, error) { return r.val, r.err }

func (r *reply) Int64() (int64, error) {
	if r.err != nil {
		return 0, r.err
	}
	return toInt64(r.val)
}

func (r *reply) Slice() ([]any, error) {
	if r.err != nil {
		return nil, r.err
	}
	s, ok := r.val.([]any)
	if !ok {
		return nil, fmt.Errorf("rueidisfence: unexpected reply %v (%T), want an array", r.val, r.val)
	}
	return s, nil
}

func (r *reply) Int64Slice() ([]int64, error) {
	s, err := r.Slice()
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(s))
	for i, v := range s {
		if out[i], err = toInt64(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func toInt64(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("rueidisfence: unexpected reply %v (%T), want an integer", v, v)
}
