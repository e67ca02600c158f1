package electionmodel

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// PlantedHolder is the holder id of every record a planter writes, by
// which the backends' logs mark it Planted.
const PlantedHolder = "planted-holder"

// plantAhead is how far above the newest record (and, for a twin, the
// server's clock) a planted record's token is: 5 s of the server's clock
// in µs, as a server whose clock went back by that much would leave.
const plantAhead = 5_000_000

// PlantRedis writes, on every client's server (the nodes of a Redlock, or
// one), a record of PlantedHolder that lives for life, the same on each,
// and reports whether it wrote one. It writes none while a planted record
// stands on any of them.
//
// Without advance (Config.Plant) the record's token is 5 s of the
// server's clock above the newest record there; nothing is written where
// no server has a record. With advance (Config.Twin) it is 5 s above that
// and above the first server's clock, and advance is first called with
// the token less one, to raise the lock's token counter there (through a
// Locker's Advance): the next grant's token is then the record's own.
func PlantRedis(ctx context.Context, cs []*redis.Client, recKey string, life time.Duration, advance func(context.Context, fence.Token) error) bool {
	var top uint64
	for _, c := range cs {
		rec, err := c.HMGet(ctx, recKey, "t", "h").Result()
		if err != nil {
			return false
		}
		if rec[1] == PlantedHolder {
			// A planted record stands: leave it for a grant to meet (a
			// twin written over by the next plant is never met).
			return false
		}
		if s, ok := rec[0].(string); ok {
			if tok, err := strconv.ParseUint(s, 10, 64); err == nil {
				top = max(top, tok)
			}
		}
	}
	if advance != nil {
		now, err := cs[0].Time(ctx).Result()
		if err != nil {
			return false
		}
		top = max(top, uint64(now.UnixMicro()))
	}
	if top == 0 {
		return false
	}
	tok := top + plantAhead
	if advance != nil {
		if err := advance(ctx, fence.Token(tok-1)); err != nil {
			return false
		}
	}
	planted := strconv.FormatUint(tok, 10)
	done := false
	for _, c := range cs {
		if c.HSet(ctx, recKey, "v", "planted", "t", planted, "h", PlantedHolder).Err() == nil {
			c.PExpire(ctx, recKey, life)
			done = true
		}
	}
	return done
}
