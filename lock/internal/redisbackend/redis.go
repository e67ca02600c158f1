package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

// names is what the Redis backends say of a resource's keys (package
// lock's RedisNames).
type names interface {
	LockKey(resource string) string
	TokenKey(resource string) string
	Channel(resource string) string
}

// IsNil reports whether c is nil or a nil client of go-redis's types.
func IsNil(c redis.UniversalClient) bool {
	switch v := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return v == nil
	case *redis.ClusterClient:
		return v == nil
	case *redis.Ring:
		return v == nil
	}
	return false
}

// redisBackend holds the locks of one Redis deployment (a server, a
// Cluster, a Ring or a failover client): a resource's state lives in keys
// that share its hash tag, and each call is one script (see scripts.go).
// It is the Locker's backend for New.
type redisBackend struct {
	client      Client
	prefix      string
	retentionMS int64
	// The scripts' per-Locker arguments, converted to interface values once
	// rather than on every call.
	retentionArg any // retentionMS
	sharded      any // "1" when releases publish with SPUBLISH, else ""
	releaseMode  any // release.lua's ARGV[3]: "p" or "s" (SPUBLISH), then retentionMS

	// calls runs the calls to client so that each returns by its context's
	// deadline whatever the client's options, and counts those it left
	// running in the background (see package rediscall).
	calls      *rediscall.Calls
	hub        *hub // nil when Acquire polls (WithWait)
	background func(ctx context.Context, f func(ctx context.Context))
	putScript  atomic.Pointer[script] // see recordPut; nil: record_put.lua
}

// New returns the backend of a Locker made by lock.New on client.
func New(client redis.UniversalClient, s lockbackend.Settings) (lockbackend.Backend, error) {
	return newRedis(goRedisOf(client), s)
}

// NewOn returns the backend of a Locker on client, of any client library.
func NewOn(client Client, s lockbackend.Settings) (lockbackend.Backend, error) {
	return newRedis(client, s)
}

func newRedis(client Client, s lockbackend.Settings) (*redisBackend, error) {
	if s.Given&lockbackend.GivenNodeTimeout != 0 {
		return nil, fmt.Errorf("%w: WithNodeTimeout is an option of NewRedlock", ErrUnsupported)
	}
	b := &redisBackend{client: client, prefix: s.Prefix, retentionMS: s.Retention.Milliseconds(),
		calls: rediscall.For(client.HonoursDeadlines()), background: s.Background}
	b.retentionArg, b.sharded = b.retentionMS, ""
	mode := "p"
	if client.Sharded() {
		b.sharded, mode = "1", "s"
	}
	b.releaseMode = mode + strconv.FormatInt(b.retentionMS, 10)
	if !s.Poll {
		b.hub = newHub(client)
	}
	return b, nil
}

func (b *redisBackend) Info() lockbackend.Info {
	return lockbackend.Info{Name: "redis", Quorum: 1, Queue: b.hub != nil, Owner: true}
}

func (b *redisBackend) Close(deadline time.Time) {
	if b.hub != nil {
		b.hub.close(deadline)
	}
	b.calls.Wait(deadline)
}

func (b *redisBackend) LockKey(resource string) string {
	return b.prefix + "{" + resource + "}:lock"
}

func (b *redisBackend) TokenKey(resource string) string {
	return b.prefix + "{" + resource + "}:token"
}

func (b *redisBackend) Channel(resource string) string {
	return b.prefix + "{" + resource + "}:released"
}

func (b *redisBackend) FenceKey(lockKey string) string {
	return b.prefix + "{" + SlotTag(lockKey) + "}:fence:" + lockKey
}

// Positions in the key slice of a resource (see resourceKeys).
const (
	keyLock = iota
	keyToken
	keyHolds
	keyQueue
	keyWaiting
	numKeys
)

// resourceKeys writes resource's keys to buf, in the order the scripts
// take them, and returns them as a slice of buf, with the release channel:
// the lock, the token state, the hold record of a lock taken with an owner
// (":holds", see acquire.lua; it expires with the lock), and the wait
// queue: the holder ids of the waiters in Acquire, first come first served
// (":queue"), and each one's entry (":waiting"); both expire once no
// waiter refreshes them. All are
// cut from one string, so a grant pays one allocation for them instead of
// one each, and none for the slice.
func (b *redisBackend) resourceKeys(buf *[numKeys]string, resource string) (keys []string, channel string) {
	base := len(b.prefix) + len(resource) + 2
	suffixes := [...]string{":lock", ":token", ":holds", ":queue", ":waiting", ":released"}
	var sb strings.Builder
	sb.Grow(len(suffixes)*base + len(":lock:token:holds:queue:waiting:released"))
	var ends [len(suffixes)]int
	for i, suffix := range suffixes {
		sb.WriteString(b.prefix)
		sb.WriteByte('{')
		sb.WriteString(resource)
		sb.WriteByte('}')
		sb.WriteString(suffix)
		ends[i] = sb.Len()
	}
	all := sb.String()
	from := 0
	for i := range numKeys {
		buf[i] = all[from:ends[i]]
		from = ends[i]
	}
	return buf[:], all[from:]
}

// redisHold is one grant on Redis: its keys and holder, kept where the
// scripts' arguments can point at them (go-redis writes a *string or
// *int64 as its value), so that a grant, its renewals and its release box
// no key, holder or number into an interface.
type redisHold struct {
	resource string
	keyBuf   [numKeys]string
	holder   string
	acq      string // this acquisition's id in an owner's hold record; "" without owner
	// tryMS are the uncontended try's lease and token-state life in ms.
	tryMS [2]int64
	// tryArgs backs the uncontended try's arguments: the hold is made for
	// the try anyway, so they cost no allocation of their own. Only the
	// try uses it, once.
	tryArgs [9]any
	// releaseArgs backs the first release's arguments, as tryArgs does the
	// try's; releasing marks it taken, so a second release of the hold
	// (two goroutines at once, or one in the background after a release
	// cut short whose call still runs) makes its own.
	releaseArgs [11]any
	releasing   atomic.Bool
}

// Try is one try of an acquisition: try.lua for a plain one (the fewest
// calls), acquire.lua when it finds waiters queued, joins the queue or has
// an owner.
func (b *redisBackend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	resource, ttl := req.Resource, req.TTL
	// The holder id is fresh for every acquisition. With an owner it also
	// names this acquisition in the hold record, so a retried re-entry is
	// recognised, and it becomes the holder only if this call takes the
	// lock afresh.
	h := &redisHold{resource: resource, holder: req.Holder}
	if req.Owner != "" {
		h.acq = req.Holder
	}
	keys, channel := b.resourceKeys(&h.keyBuf, resource)
	var holderArg any = &h.holder
	h.tryMS = [2]int64{ttl.Milliseconds(), ttl.Milliseconds() + b.retentionMS}
	// A call cut short at ctx's end (see calls.go) may still take the lock:
	// late releases it once the call has returned.
	var late func(Reply)
	if !b.calls.Direct(ctx) {
		late = b.lateCleanup(ctx, resource, req.Holder, h.acq)
	}
	var (
		kind, n, third int64
		place          int64 = -1
		missed         bool
		err            error
	)
	if req.Owner == "" && !req.Queue {
		// Without an owner and without joining the queue every reply is
		// numbers (the fast path's grant: the token as text), read without
		// boxing each one.
		// try.lua makes the grant with the fewest calls; only when it
		// finds the lock free with waiters queued does acquire.lua run, to
		// hand the lock to the first of them.
		var args []any
		if req.Ordered {
			h.tryArgs = [...]any{"evalsha", tryHash, 3, &h.keyBuf[keyLock], &h.keyBuf[keyToken], &h.keyBuf[keyQueue],
				holderArg, &h.tryMS[0], &h.tryMS[1]}
			args = h.tryArgs[:]
		} else {
			h.tryArgs = [...]any{"evalsha", tryHash, 2, &h.keyBuf[keyLock], &h.keyBuf[keyToken],
				holderArg, &h.tryMS[0], &h.tryMS[1], nil}
			args = h.tryArgs[:8]
		}
		var cmd Reply
		if late == nil {
			cmd = runScript(ctx, b.client, trySrc, args)
		} else {
			cmd = cutCall(ctx, b.calls, func(ctx context.Context) Reply { return runScript(ctx, b.client, trySrc, args) }, late)
		}
		if tok, ok := cmd.Val().(string); ok && cmd.Err() == nil {
			// try_fast.lua's grant: the token as text, followed by " 0"
			// when no token state was found.
			kind = 1
			digits, cut := strings.CutSuffix(tok, " 0")
			if n, err = strconv.ParseInt(digits, 10, 64); err != nil {
				err = fmt.Errorf("unexpected reply %q", tok)
			}
			missed = cut
		} else {
			var res []int64
			res, err = cmd.Int64Slice()
			if err == nil && len(res) == 1 && res[0] == 4 {
				res, err = b.script(ctx, late, acquireScript, keys,
					holderArg, ttl.Milliseconds(), b.retentionArg, "", "", channel, b.sharded).Int64Slice()
			}
			if err == nil && (len(res) < 2 || len(res) > 3 || res[0] > 1) {
				err = fmt.Errorf("unexpected reply %v", res)
			}
			if err == nil {
				kind, n = res[0], res[1]
				missed = len(res) == 3
			}
		}
	} else {
		var raw []any
		switch {
		case req.Queue:
			raw, err = b.script(ctx, late, acquireScript, keys,
				holderArg, ttl.Milliseconds(), b.retentionArg, req.Owner, queueLifeArg, channel, b.sharded).Slice()
		case req.Ordered: // with an owner
			raw, err = b.script(ctx, late, acquireScript, keys,
				holderArg, ttl.Milliseconds(), b.retentionArg, req.Owner, "", channel, b.sharded).Slice()
		default:
			raw, err = b.script(ctx, late, acquireScript, keys[:keyQueue],
				holderArg, ttl.Milliseconds(), b.retentionArg, req.Owner).Slice()
		}
		if err == nil {
			holder := h.holder
			if kind, n, third, place, err = parseAcquire(raw, &holder); kind == 2 {
				h.holder = holder // holderArg points at it
			} else if err == nil && kind == 1 && third == 1 {
				missed = true
			}
		}
	}
	if err != nil {
		if !isReply(err) && !rediscall.IsCut(err) {
			// The script may have run even though its reply was lost. (A
			// call cut short is cleaned up after by late, once it returns.)
			b.cleanup(ctx, resource, req.Holder, h.acq)
		}
		return lockbackend.Outcome{}, translate(ctx, err, "acquire", resource)
	}
	if kind == 0 {
		out := lockbackend.Outcome{Remaining: time.Duration(n) * time.Millisecond, Place: -1}
		if third > 0 {
			out.Ref, out.Place = third, place
		}
		return out, nil
	}
	if n < 1 {
		// A retried grant whose token state vanished in between: its token
		// is unknown, so it cannot be used.
		b.cleanup(ctx, resource, req.Holder, h.acq)
		return lockbackend.Outcome{}, fmt.Errorf("lock: acquire %q: the token state was lost during the grant; try again", resource)
	}
	out := lockbackend.Outcome{Granted: true, Hold: h, Token: fence.Token(n), Holder: h.holder, Known: ttl, StateMissed: missed}
	if kind == 3 {
		// A release granted the lock to this queued holder earlier; the
		// lease has what Redis says is left of it, counted from this try.
		out.Known, out.HandedOver = time.Duration(max(third, 0))*time.Millisecond, true
	}
	return out, nil
}

// parseAcquire reads acquire.lua's reply: {0, remaining ms[, refreshed
// µs, place]}, {1, token[, 1]}, {2, token, holder} (a re-entry, whose
// holder replaces *holder) or {3, token, remaining ms}. third is the
// reply's third number, 0 when it has none; place is a queued refusal's
// place in the queue (0 for the head), -1 when it has none.
func parseAcquire(raw []any, holder *string) (kind, n, third, place int64, err error) {
	bad := fmt.Errorf("unexpected reply %v", raw)
	place = -1
	if len(raw) < 2 || len(raw) > 4 {
		return 0, 0, 0, place, bad
	}
	kind, ok1 := raw[0].(int64)
	n, ok2 := raw[1].(int64)
	if !ok1 || !ok2 || kind < 0 || kind > 3 || len(raw) == 4 && kind != 0 {
		return 0, 0, 0, place, bad
	}
	if kind == 2 {
		if len(raw) != 3 {
			return 0, 0, 0, place, bad
		}
		cur, ok := raw[2].(string)
		if !ok {
			return 0, 0, 0, place, bad
		}
		*holder = cur
		return kind, n, 0, place, nil
	}
	if len(raw) >= 3 {
		if third, ok1 = raw[2].(int64); !ok1 {
			return 0, 0, 0, place, bad
		}
	} else if kind == 3 {
		return 0, 0, 0, place, bad
	}
	if len(raw) == 4 {
		// A holder dropped from the queue meanwhile has no place (nil):
		// it is not the head.
		if p, ok := raw[3].(int64); ok {
			place = p
		}
	}
	return kind, n, third, place, nil
}

// Abandon releases what an acquisition whose reply was lost, or a waiter
// that gave up, may hold: the grant of holder, or with an owner the hold
// acq; it also takes holder out of the wait queue, and a grant a release
// made to it while it was queued is released (and handed on) too.
func (b *redisBackend) Abandon(ctx context.Context, resource, holder, acq string) error {
	var buf [numKeys]string
	keys, _ := b.resourceKeys(&buf, resource)
	if acq != "" {
		holder = "" // a re-entry's holder is the one the hold record names
	}
	err := b.script(ctx, nil, releaseScript, keys, holder, b.releaseMode, acq, "1").Err()
	if err != nil && !isReply(err) {
		return lockbackend.ReplyLost(err)
	}
	return err
}

// cleanup runs Abandon while ctx lasts, and what ctx leaves undone (it
// ended, or the reply was lost again) in the background, bounded by
// cleanupTimeout, so the caller returns by its deadline and [Locker.Close]
// waits for the rest.
func (b *redisBackend) cleanup(ctx context.Context, resource, holder, acq string) {
	if ctx.Err() == nil {
		if err := b.Abandon(ctx, resource, holder, acq); !errors.Is(err, lockbackend.ErrReplyLost) {
			return
		}
	}
	b.background(ctx, func(ctx context.Context) { _ = b.Abandon(ctx, resource, holder, acq) })
}

func (b *redisBackend) Release(ctx context.Context, hold lockbackend.Hold) error {
	h := hold.(*redisHold)
	// A hold without owner sends no acquisition id: release.lua's plain
	// path is for a release with two arguments (each one costs Redis a
	// string and a place in ARGV).
	var args []any
	if h.releasing.CompareAndSwap(false, true) {
		args = h.releaseArgs[:]
	} else {
		args = make([]any, len(h.releaseArgs))
	}
	copy(args, []any{"evalsha", releaseHash, numKeys, &h.keyBuf[0], &h.keyBuf[1], &h.keyBuf[2], &h.keyBuf[3], &h.keyBuf[4],
		&h.holder, b.releaseMode, &h.acq})
	if h.acq == "" {
		args = args[:len(args)-1]
	}
	var cmd Reply
	if b.calls.Direct(ctx) {
		cmd = runScript(ctx, b.client, releaseSrc, args)
	} else {
		// Cut short, the release goes on in the client (see Release).
		cmd = cutCall(ctx, b.calls, func(ctx context.Context) Reply { return runScript(ctx, b.client, releaseSrc, args) }, nil)
	}
	n, err := cmd.Int64()
	switch {
	case err != nil && !isReply(err):
		return lockbackend.ReplyLost(translate(ctx, err, "release", h.resource))
	case err != nil:
		return translate(ctx, err, "release", h.resource)
	case n == 0:
		return ErrNotHeld
	}
	return nil
}

func (b *redisBackend) Extend(ctx context.Context, hold lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	h := hold.(*redisHold)
	keys := h.keyBuf[:keyHolds]
	if h.acq != "" {
		keys = h.keyBuf[:keyQueue] // with the hold record
	}
	ms, err := b.script(ctx, nil, extendScript, keys, &h.holder, ttl.Milliseconds(), b.retentionArg).Int64()
	if err != nil {
		return 0, translate(ctx, err, "extend", h.resource)
	}
	if ms == -3 {
		return 0, ErrNotHeld
	}
	// The lock lives ms from when the script ran, which is after sent.
	return time.Duration(max(ms, ttl.Milliseconds())) * time.Millisecond, nil
}

func (b *redisBackend) TTL(ctx context.Context, hold lockbackend.Hold) (time.Duration, error) {
	h := hold.(*redisHold)
	ms, err := b.script(ctx, nil, ttlScript, h.keyBuf[:keyToken], &h.holder).Int64()
	if err != nil {
		return 0, translate(ctx, err, "ttl", h.resource)
	}
	if ms == -3 {
		return 0, ErrNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func (b *redisBackend) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	err := b.script(ctx, nil, advanceScript, []string{b.TokenKey(resource)}, int64(atLeast), b.retentionMS).Err()
	return translate(ctx, err, "advance", resource)
}

// Join and Adopt are the wait queue's client side (see wait.go, queue.go
// and subscribe.go).
func (b *redisBackend) Join(resource, holder string, create bool) lockbackend.Waiter {
	if w := b.hub.join(b.Channel(resource), create, holder); w != nil {
		return w
	}
	return nil
}

func (b *redisBackend) Adopt(req *lockbackend.Request, g lockbackend.HandOver) lockbackend.Hold {
	h := &redisHold{resource: req.Resource, holder: req.Holder}
	if req.Owner != "" {
		h.acq = req.Holder
	}
	b.resourceKeys(&h.keyBuf, req.Resource)
	return h
}

// fenceLock runs foreign.lua for Locker.FenceLock.
func (b *redisBackend) FenceLock(ctx context.Context, op, lockKey, value string, floor fence.Token) (fence.Fence, error) {
	res, err := b.script(ctx, nil, foreignScript, []string{lockKey, b.FenceKey(lockKey)},
		value, strconv.FormatInt(int64(floor), 10), b.retentionMS).Int64Slice()
	if err == nil && (len(res) == 0 || res[0] == 1 && len(res) != 2) {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		return fence.Fence{}, translate(ctx, err, op, lockKey)
	}
	if res[0] == 0 {
		return fence.Fence{}, fmt.Errorf("%w: %s %q: the key holds another value or none", ErrNotHeld, op, lockKey)
	}
	return fence.Fence{Resource: lockKey, Token: fence.Token(res[1]), Holder: value}, nil
}

var _ interface {
	lockbackend.Backend
	lockbackend.Queue
	lockbackend.Advancer
	lockbackend.Recorder
	names
} = (*redisBackend)(nil)
