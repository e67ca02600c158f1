package electionmodel

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// PlantedHolder is the holder id of every record a planter writes, by
// which the backends' logs mark it Planted.
const PlantedHolder = "planted-holder"

// plantAhead is how far above the newest record (and, for a twin, the
// server's clock) a planted record's token is: 5 s of the server's clock
// in µs, as a server whose clock went back by that much would leave.
const plantAhead = 5_000_000

// PlantKind is which record a planter writes.
type PlantKind int

const (
	// PlantAbove is a record 5 s of the server's clock above the newest
	// (Config.Plant).
	PlantAbove PlantKind = iota
	// PlantTwin is a record of the token the lock grants next
	// (Config.Twin).
	PlantTwin
	// PlantOlder is a record one token below the newest, of the same
	// holder (Config.Older): a read finds it while that holder holds the
	// lock, as it finds only a record of the lock's holder.
	PlantOlder
)

// PlantRedis writes, on every client's server (the nodes of a Redlock, or
// one), a record of kind k that lives for life, the same on each, and
// reports whether it wrote one: of PlantedHolder, or for an older record,
// of the newest record's holder. It writes none while a
// planted record stands on any of them, nor, but for a twin, where no
// server has a record.
//
// A twin's token is 5 s above the newest record and above the first
// server's clock, and advance (a Locker's Advance) is first called with
// the token less one, to raise the lock's token counter there: the next
// grant's token is then the record's own.
func PlantRedis(ctx context.Context, cs []*redis.Client, recKey string, life time.Duration, k PlantKind, advance func(context.Context, fence.Token) error) bool {
	var top uint64
	holder := PlantedHolder
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
			if tok, err := strconv.ParseUint(s, 10, 64); err == nil && tok > top {
				top = tok
				if h, ok := rec[1].(string); ok && k == PlantOlder {
					holder = h
				}
			}
		}
	}
	if k == PlantTwin {
		now, err := cs[0].Time(ctx).Result()
		if err != nil {
			return false
		}
		top = max(top, uint64(now.UnixMicro()))
	}
	if top == 0 {
		return false
	}
	var tok uint64
	switch k {
	case PlantAbove:
		tok = top + plantAhead
	case PlantTwin:
		tok = top + plantAhead
		if err := advance(ctx, fence.Token(tok-1)); err != nil {
			return false
		}
	case PlantOlder:
		tok = top - 1
	}
	planted := strconv.FormatUint(tok, 10)
	done := false
	for _, c := range cs {
		if c.HSet(ctx, recKey, "v", "planted", "t", planted, "h", holder).Err() == nil {
			c.PExpire(ctx, recKey, life)
			done = true
		}
	}
	return done
}

// RedisPlanters returns the planters of a Redis deployment (Config.Plant,
// Config.Twin, Config.Older) for an election named name on l, whose
// record is recKey on every client's server, for terms of ttl: planted
// records live three TTLs, twins six (long enough for their token's grant
// to meet them).
func RedisPlanters(cs []*redis.Client, recKey string, ttl time.Duration, l *lock.Locker, name string) (plant, twin, older func(context.Context) bool) {
	advance := func(ctx context.Context, x fence.Token) error { return l.Advance(ctx, name, x) }
	plant = func(ctx context.Context) bool { return PlantRedis(ctx, cs, recKey, 3*ttl, PlantAbove, nil) }
	twin = func(ctx context.Context) bool { return PlantRedis(ctx, cs, recKey, 6*ttl, PlantTwin, advance) }
	older = func(ctx context.Context) bool { return PlantRedis(ctx, cs, recKey, 3*ttl, PlantOlder, nil) }
	return plant, twin, older
}
