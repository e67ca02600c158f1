package suite

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// A Locker is one contender: fencekit, a peer library, or the floor (plain
// commands). Each has its own Redis client.
type Locker interface {
	// TryAcquire makes one attempt; errBusy when another holder has it.
	TryAcquire(ctx context.Context, resource string) (Held, error)
	// Acquire waits, the library's own way, until it holds resource.
	Acquire(ctx context.Context, resource string) (Held, error)
	// Commands is how many commands the client has sent so far, pipelined
	// ones included (subscriptions excepted: count those on the server).
	Commands() int64
	Close()
}

// Held is a grant, released once.
type Held interface {
	Release(ctx context.Context) error
}

var errBusy = errors.New("held by another")

// leaseTTL is every contender's lease, long enough never to run out.
const leaseTTL = 10 * time.Second

// Contender names, in the order the report lists them.
const (
	Fencekit        = "fencekit"
	FencekitPolling = "fencekit polling"
	Redislock       = "redislock"
	Redsync         = "redsync"
	Rueidislock     = "rueidislock"
	Floor           = "floor"
	FloorLua        = "floor in Lua"
	FloorToken      = "floor with a token"
)

// NewLocker returns contender name on a fresh client of addr; prefix keeps
// its keys apart from the other contenders'.
func NewLocker(name, addr, prefix string) (Locker, error) {
	switch name {
	case Fencekit, FencekitPolling:
		c, n := countedClient(addr)
		opts := []lock.Option{lock.WithPrefix(prefix)}
		if name == FencekitPolling {
			opts = append(opts, lock.WithWait(lock.Backoff(time.Millisecond, 64*time.Millisecond)))
		}
		l, err := lock.New(c, opts...)
		if err != nil {
			return nil, err
		}
		return &fencekitLocker{l: l, closeClient: func() { _ = c.Close() }, n: n}, nil
	case FencekitRueidis:
		return newFencekitRueidis(addr, prefix)
	case Redislock:
		c, n := countedClient(addr)
		return &redislockLocker{l: redislock.New(c), c: c, n: n, prefix: prefix}, nil
	case Redsync:
		c, n := countedClient(addr)
		return &redsyncLocker{rs: redsync.New(goredis.NewPool(c)), c: c, n: n, prefix: prefix}, nil
	case Rueidislock:
		n := new(atomic.Int64)
		l, err := rueidislock.NewLocker(rueidislock.LockerOption{
			ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}},
			KeyPrefix:      prefix + "rueidislock",
			KeyMajority:    1,
			NoLoopTracking: true,
			// Its default, 20ms per try, fails calls outright when the
			// machine is busy; a timeout changes nothing about its speed.
			TryNextAfter: time.Second,
			ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
				c, err := rueidis.NewClient(o)
				if err != nil {
					return nil, err
				}
				return countingRueidis{Client: c, n: n}, nil
			},
		})
		if err != nil {
			return nil, err
		}
		return &rueidisLocker{l: l, n: n}, nil
	case Floor:
		c, n := countedClient(addr)
		return &floorLocker{c: c, n: n, prefix: prefix}, nil
	case FloorLua:
		c, n := countedClient(addr)
		return &floorLocker{c: c, n: n, prefix: prefix + "lua:", lua: true}, nil
	case FloorToken:
		c, n := countedClient(addr)
		return &tokenFloorLocker{c: c, n: n, prefix: prefix + "token:"}, nil
	}
	return nil, fmt.Errorf("unknown contender %q", name)
}

// --- fencekit

// fencekitLocker is fencekit's Locker on either client: closeClient closes
// the client it was made on.
type fencekitLocker struct {
	l           *lock.Locker
	closeClient func()
	n           *atomic.Int64
}

func (f *fencekitLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	lease, err := f.l.TryAcquire(ctx, resource, leaseTTL)
	if errors.Is(err, lock.ErrNotAcquired) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return lease, nil
}

func (f *fencekitLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	lease, err := f.l.Acquire(ctx, resource, leaseTTL)
	if err != nil {
		return nil, err
	}
	return lease, nil
}

func (f *fencekitLocker) Commands() int64 { return f.n.Load() }
func (f *fencekitLocker) Close()          { f.l.Close(); f.closeClient() }

// --- bsm/redislock

type redislockLocker struct {
	l      *redislock.Client
	c      *redis.Client
	n      *atomic.Int64
	prefix string
}

func (r *redislockLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	lk, err := r.l.Obtain(ctx, r.prefix+resource, leaseTTL, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return lk, nil
}

// Acquire retries every 100ms, as redislock's README does; Obtain gives up at
// the lease's length, and is then called again.
func (r *redislockLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)}
	for {
		lk, err := r.l.Obtain(ctx, r.prefix+resource, leaseTTL, opts)
		if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return nil, err
		}
		return lk, nil
	}
}

func (r *redislockLocker) Commands() int64 { return r.n.Load() }
func (r *redislockLocker) Close()          { r.c.Close() }

// --- go-redsync/redsync

type redsyncLocker struct {
	rs     *redsync.Redsync
	c      *redis.Client
	n      *atomic.Int64
	prefix string
}

type redsyncHeld redsync.Mutex

func (h *redsyncHeld) Release(ctx context.Context) error {
	_, err := (*redsync.Mutex)(h).UnlockContext(ctx)
	return err
}

func (r *redsyncLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	m := r.rs.NewMutex(r.prefix+resource, redsync.WithExpiry(leaseTTL))
	err := m.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return (*redsyncHeld)(m), nil
}

// Acquire uses redsync's default retries (32 tries, 50–250ms apart) and
// starts again when they run out.
func (r *redsyncLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	m := r.rs.NewMutex(r.prefix+resource, redsync.WithExpiry(leaseTTL))
	for {
		err := m.LockContext(ctx)
		if err == nil {
			return (*redsyncHeld)(m), nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
}

func (r *redsyncLocker) Commands() int64 { return r.n.Load() }
func (r *redsyncLocker) Close()          { r.c.Close() }

// --- rueidislock

type rueidisLocker struct {
	l rueidislock.Locker
	n *atomic.Int64
}

type rueidisHeld context.CancelFunc

func (h rueidisHeld) Release(context.Context) error { h(); return nil }

func (r *rueidisLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	_, cancel, err := r.l.TryWithContext(ctx, resource)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return rueidisHeld(cancel), nil
}

func (r *rueidisLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	_, cancel, err := r.l.WithContext(ctx, resource)
	if err != nil {
		return nil, err
	}
	return rueidisHeld(cancel), nil
}

func (r *rueidisLocker) Commands() int64 { return r.n.Load() }
func (r *rueidisLocker) Close()          { r.l.Close() }

// countingRueidis counts the commands a rueidis client sends; a read served
// from its client-side cache sends none.
type countingRueidis struct {
	rueidis.Client
	n *atomic.Int64
}

func (c countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.n.Add(int64(len(cmds)))
	return c.Client.DoMulti(ctx, cmds...)
}

func (c countingRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	r := c.Client.DoCache(ctx, cmd, ttl)
	if !r.IsCacheHit() {
		c.n.Add(1)
	}
	return r
}

// --- the floor: SET NX PX, then DEL, as plain commands

type floorLocker struct {
	c      *redis.Client
	n      *atomic.Int64
	prefix string
	lua    bool // FloorLua: each command in a script of its own
}

type floorHeld struct {
	c   *redis.Client
	key string
	lua bool
}

func (h *floorHeld) Release(ctx context.Context) error {
	if h.lua {
		return floorDel.Run(ctx, h.c, []string{h.key}).Err()
	}
	return h.c.Del(ctx, h.key).Err()
}

// The floor in Lua: the same two commands, each alone in a script. What a
// lock made of scripts costs before its scripts do anything of their own.
var (
	floorSet = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`)
	floorDel = redis.NewScript(`return redis.call('DEL', KEYS[1])`)
)

var leaseTTLArg = strconv.FormatInt(leaseTTL.Milliseconds(), 10)

func (f *floorLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	key := f.prefix + resource
	var ok bool
	var err error
	if f.lua {
		err = floorSet.Run(ctx, f.c, []string{key}, "v", leaseTTLArg).Err()
		ok = err == nil
		if err == redis.Nil {
			err = nil
		}
	} else {
		ok, err = f.c.SetNX(ctx, key, "v", leaseTTL).Result()
	}
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errBusy
	}
	return &floorHeld{c: f.c, key: key, lua: f.lua}, nil
}

func (f *floorLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	return nil, errors.New("the floor does not wait")
}

func (f *floorLocker) Commands() int64 { return f.n.Load() }
func (f *floorLocker) Close()          { f.c.Close() }

// --- the floor with a token: the least a lock pays that issues a
// clock-anchored fencing token in its grant's round trip

// tokenFloorGrant takes the lock as the floor does and, only if it took it,
// reads the server clock and the counter and writes max(counter + 1,
// clock) back as the token: the calls that a token anchored to the clock
// needs whatever else a lock does. It has none of fencekit's other duties
// (no look at a queue, no record that tells a client's retry of the grant
// from a new one) and nothing for bad input: it measures, it is not a lock
// to use.
var tokenFloorGrant = redis.NewScript(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local n = redis.call('GET', KEYS[2])
if n and (#n > #now or (#n == #now and n >= now)) then
  now = string.format('%d', tonumber(n) + 1)
end
redis.call('SET', KEYS[2], now, 'PX', ARGV[3])
return now`)

// tokenFloorRelease deletes the lock only for its holder, as a lock must
// (redislock's release makes the same two calls).
var tokenFloorRelease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

type tokenFloorLocker struct {
	c      *redis.Client
	n      *atomic.Int64
	prefix string
}

type tokenFloorHeld struct {
	c      *redis.Client
	key    string
	holder string
}

func (h *tokenFloorHeld) Release(ctx context.Context) error {
	return tokenFloorRelease.Run(ctx, h.c, []string{h.key}, h.holder).Err()
}

// tokenRetentionArg is how long the counter outlives a grant: the lease and
// then fencekit's default token retention, as fencekit's grant sets it.
var tokenRetentionArg = strconv.FormatInt((leaseTTL + lock.DefaultTokenRetention).Milliseconds(), 10)

func (f *tokenFloorLocker) TryAcquire(ctx context.Context, resource string) (Held, error) {
	key := f.prefix + "{" + resource + "}"
	holder := fence.NewHolder() // as random as a lock's must be
	tok, err := tokenFloorGrant.Run(ctx, f.c, []string{key, key + ":token"}, holder, leaseTTLArg, tokenRetentionArg).Text()
	if err == redis.Nil {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	// A lock hands its holder the token as a number: so does the floor.
	if _, err := strconv.ParseInt(tok, 10, 64); err != nil {
		return nil, fmt.Errorf("floor with a token: reply %q: %w", tok, err)
	}
	return &tokenFloorHeld{c: f.c, key: key, holder: holder}, nil
}

func (f *tokenFloorLocker) Acquire(ctx context.Context, resource string) (Held, error) {
	return nil, errors.New("the floor with a token does not wait")
}

func (f *tokenFloorLocker) Commands() int64 { return f.n.Load() }
func (f *tokenFloorLocker) Close()          { f.c.Close() }

// countedClient returns a client of addr and the count of commands it sends.
func countedClient(addr string) (*redis.Client, *atomic.Int64) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	n := new(atomic.Int64)
	c.AddHook(counter{n})
	return c, n
}

type counter struct{ n *atomic.Int64 }

func (h counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
