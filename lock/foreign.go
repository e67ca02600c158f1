package lock

import (
	"context"
	"fmt"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// FenceLock returns a fence for a lock that another library took and still
// holds: a lock whose Redis key lockKey holds the random value its holder
// stored there (SET lockKey value NX PX), as redsync and bsm/redislock do. It
// lets code keep its lock and still present fences to storage.
//
// The fence is {Resource: lockKey, Token, Holder: value}. FenceLock issues a
// token only while lockKey holds exactly value, in one round trip; otherwise
// it returns an error matching [ErrNotHeld] and changes nothing. Calls for
// the same grant (the same value) return the same token while its fence
// record lives, so a call whose reply was lost can simply be repeated. A
// new grant (a new value) gets a token above every earlier one. The lock
// key itself is never written: its lease, release and extension stay with
// the library that took it.
//
// Tokens follow the rule of [Locker.TryAcquire]: a new grant's token is
// above the previous one and not below the Redis server's clock in
// microseconds. They live in the record [RedisNames.FenceKey] names. Each call
// keeps that record for the lock's remaining lease, as Redis reports it at
// that moment, plus the token retention ([WithTokenRetention]): FenceLock
// cannot see the lock being extended later by its own library. So a grant
// extended for longer than that without another FenceLock call outlives
// its record, and its next call issues a new, higher token for it; storage
// then refuses the grant's older fence as stale (never the reverse), which
// costs that unit of work, not data. Call FenceLock again after each
// extension of a long-held lock (or at least once per retention), or keep
// the retention above the longest the lock is held between calls. A token
// is unique to a grant only if values are: keep the libraries' random
// values (do not fix them with redsync.WithValue, redsync.WithGenValueFunc or
// redislock's Options.Token). For redsync pass mutex.Name() and
// mutex.Value(); for redislock lk.Key() and its lock value,
// lk.Token()+lk.Metadata() (redislock's random "token", not a fencing token).
// With a redsync mutex over several Redis servers, fence it on one of them:
// if that server lost the key, FenceLock returns [ErrNotHeld], and storage
// admission keeps writes safe either way.
//
// A lock key or value that storage would refuse in a fence (see
// [fence.Fence.Validate]: invalid UTF-8, a NUL byte, too long) returns an
// error matching [fence.ErrInvalid] before anything is sent. A key of another
// type in the way returns [fence.ErrWrongType] and nothing is changed. ctx
// bounds the round trip. FenceLock is offered by a Locker from [New] only (a
// foreign lock lives in one Redis deployment's keys); a Locker on any other
// backend refuses it with an error matching [fence.ErrInvalid], nothing sent.
func (l *Locker) FenceLock(ctx context.Context, lockKey, value string) (fence.Fence, error) {
	return l.fenceLock(ctx, "fence", lockKey, value, 0)
}

// FenceLockAbove is [Locker.FenceLock] for a grant whose fence a store refused
// as stale with a high-water mark at or above the grant's token: after Redis
// lost the fence record (a restart without persistence, a failover), tokens
// start low again. While lockKey still holds value it returns the grant's
// fence with a token above floor, issuing a new one if needed; later
// FenceLock calls for the grant return that token. Pass the refusal's
// [fence.StaleError] HighWater.Token as floor (see [fence.LostTo]).
//
// If lockKey no longer holds value, the refusal was deserved (another holder
// took the lock): it returns [ErrNotHeld] and changes nothing.
func (l *Locker) FenceLockAbove(ctx context.Context, lockKey, value string, floor fence.Token) (fence.Fence, error) {
	if floor < 0 || floor >= fence.MaxToken {
		return fence.Fence{}, fmt.Errorf("%w: token %d is outside [0, fence.MaxToken)", errInvalid, floor)
	}
	return l.fenceLock(ctx, "fence above", lockKey, value, floor)
}

func (l *Locker) fenceLock(ctx context.Context, op, lockKey, value string, floor fence.Token) (fence.Fence, error) {
	ff, ok := l.b.(foreignFencer)
	if !ok {
		return fence.Fence{}, fmt.Errorf("%w: FenceLock is not offered by the %s backend; fence a foreign lock on one of its Redis servers with a Locker from New", lockbackend.ErrUnsupported, l.info.Name)
	}
	switch {
	case lockKey == "":
		return fence.Fence{}, fmt.Errorf("%w: empty lock key", errInvalid)
	case value == "":
		return fence.Fence{}, fmt.Errorf("%w: empty value for lock key %q", errInvalid, lockKey)
	case len(lockKey) > fence.MaxResourceLen:
		return fence.Fence{}, fmt.Errorf("%w: lock key of %d bytes is longer than %d", errInvalid, len(lockKey), fence.MaxResourceLen)
	}
	if err := (fence.Fence{Resource: lockKey, Token: 1, Holder: value}).Validate(); err != nil {
		// No store would accept the fence: issue no token for it.
		return fence.Fence{}, fmt.Errorf("%w: %s: %w", errInvalid, op, err)
	}
	if err := checkCall(ctx, op, lockKey); err != nil {
		return fence.Fence{}, err
	}
	return ff.FenceLock(ctx, op, lockKey, value, floor)
}
