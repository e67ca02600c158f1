package lockmodel

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// redisObserveScript reads a resource's lock in one script, on the
// server's clock: the lock key's holder and absolute expiry (ms), the
// token state, the queue in order with each waiter's entry, and the clock.
var redisObserveScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local x = redis.call('PEXPIRETIME', KEYS[1])
local s = redis.call('GET', KEYS[2])
local q = redis.call('ZRANGE', KEYS[3], 0, -1)
local e = {}
if #q > 0 then
  e = redis.call('HMGET', KEYS[4], unpack(q))
end
local t = redis.call('TIME')
return {v, s, q, e, t[1], t[2], x}`)

// ObserveRedis reads a resource of the Redis lock (one server, or one
// Redlock node) at keys (lock, token state, queue, waiter entries) in one
// script. The token is the grant's in the token state, "<n> <h>" or
// "<n> <g> <h>", when its holder mark is the lock holder's; the floor is
// the server's clock in µs less one, below every later token
// (max(n+1, clock)); Left is how long the key lives from the read, rounded
// up to the millisecond Redis keeps it in.
func ObserveRedis(ctx context.Context, c redis.Scripter, keys []string) (Observation, error) {
	var o Observation
	raw, err := redisObserveScript.Run(ctx, c, keys).Slice()
	if err != nil {
		return o, err
	}
	if len(raw) != 7 {
		return o, fmt.Errorf("observe: %d values", len(raw))
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(raw[4]), 10, 64)
	usec, _ := strconv.ParseInt(fmt.Sprint(raw[5]), 10, 64)
	now := sec*1_000_000 + usec
	o.Floor = fence.Token(now - 1)
	if v, ok := raw[0].(string); ok {
		o.Holder = v
		if exp, _ := raw[6].(int64); exp > 0 {
			// Redis keeps a key while its millisecond clock is at or below
			// the expiry: until the expiry's millisecond has passed.
			o.Left = time.Duration((exp+1)*1000-now) * time.Microsecond
		}
		if s, ok := raw[1].(string); ok {
			f := strings.Fields(s)
			var g, h string
			switch len(f) {
			case 2:
				g, h = f[0], f[1]
			case 3:
				g, h = f[1], f[2]
			}
			if h != "" && strings.HasPrefix(v, h) {
				n, _ := strconv.ParseInt(g, 10, 64)
				o.Token = fence.Token(n)
			}
		}
	}
	q, _ := raw[2].([]any)
	e, _ := raw[3].([]any)
	for i, w := range q {
		holder, _ := w.(string)
		life := time.Duration(-1)
		if i < len(e) {
			// "<refreshed µs> <life ms> <lease ms> <owner>"
			if s, ok := e[i].(string); ok {
				if f := strings.Fields(s); len(f) >= 2 {
					ref, _ := strconv.ParseInt(f[0], 10, 64)
					ms, _ := strconv.ParseInt(f[1], 10, 64)
					life = time.Duration(ref+ms*1000-now) * time.Microsecond
				}
			}
		}
		o.Waiters = append(o.Waiters, Waiter{Holder: holder, Life: life})
	}
	return o, nil
}

// RedlockDrift is Redlock's drift allowance for a lease of ttl, sent in
// whole milliseconds: ttl/100 + 2 ms. A quorum holds a lease that long
// past the validity its holder is told ([Backend.Drift]).
func RedlockDrift(ttl time.Duration) time.Duration {
	return ttl.Truncate(time.Millisecond)/100 + 2*time.Millisecond
}
