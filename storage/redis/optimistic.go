package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/fencekit/fencekit/internal/rediscmd"

	"github.com/fencekit/fencekit/fence"
)

// Load reads key without a fence: no admission, no change to the
// high-water mark. Use it with [Store.CompareAndSet]; a read that a fenced
// write depends on must be [Store.FencedGet] instead.
//
// When the key holds no live value, Load returns an error matching
// [fence.ErrNotFound] together with a Value whose Version is the key's
// current version (0 for a key never written). ctx bounds the call.
func (s *Store) Load(ctx context.Context, key string) (Value, error) {
	r, err := s.load(ctx, key)
	if err != nil {
		return Value{}, err
	}
	v := Value{Data: r.data, Version: r.version, ExpiresAt: r.expires, Exists: r.status == "OK"}
	if !v.Exists {
		return v, fmt.Errorf("storage/redis: load %q: %w", key, fence.ErrNotFound)
	}
	return v, nil
}

// HighWater returns the key's high-water mark: the newest fence admitted for
// it, with the resource it was set for. A key no fence has touched has the
// zero mark, which admits any valid fence. It changes nothing; ctx bounds the
// call.
func (s *Store) HighWater(ctx context.Context, key string) (fence.Fence, error) {
	r, err := s.load(ctx, key)
	if err != nil {
		return fence.Fence{}, err
	}
	return r.mark, nil
}

func (s *Store) load(ctx context.Context, key string) (_ reply, err error) {
	if err := check(ctx, key); err != nil {
		return reply{}, err
	}
	ctx, span := s.tel.start(ctx, "load", key, nil)
	defer func() { s.tel.end(ctx, span, err) }()
	// EVALSHA, not EVALSHA_RO: the read-only form needs Redis 7, and embedded
	// test servers such as miniredis refuse TIME in it.
	return s.decode(ctx, "load", key, s.run(ctx, loadScript, []string{s.redisKey(key)}), nil)
}

// CompareAndSet stores data as key's value only if the key's version is
// expected (0 for a key never written; a deleted or expired value keeps
// counting), in one script and one round trip, and returns the new version.
// It needs no lock and no fence, and neither checks nor changes the key's
// high-water mark.
//
// A mismatch gets a [*fence.ConflictError] carrying the version found and
// changes nothing. A client retry of a CompareAndSet whose reply was lost
// reports the first run's outcome, not a conflict with its own write (see
// [WithRetryWindow]). ctx bounds the call; a call that may have applied and
// cannot tell gets an error matching [fence.ErrOutcomeUnknown] (load and
// compare again: a second CompareAndSet with the same expected version
// conflicts if the first applied).
func (s *Store) CompareAndSet(ctx context.Context, key string, expected int64, data []byte, opts ...WriteOption) (int64, error) {
	cfg, err := writeOptions(opts)
	if err != nil {
		return 0, err
	}
	if data == nil {
		data = []byte{}
	}
	r, err := s.cas(ctx, "set", key, expected, data, cfg)
	return r.version, err
}

// CompareAndDelete removes key's value only if the key's version is expected,
// like [Store.CompareAndSet], and returns the version after the call (one
// more than expected when a live value was removed). The key's high-water
// mark stays as it was.
func (s *Store) CompareAndDelete(ctx context.Context, key string, expected int64) (int64, error) {
	r, err := s.cas(ctx, "del", key, expected, []byte{}, writeConfig{})
	return r.version, err
}

func (s *Store) cas(ctx context.Context, op, key string, expected int64, data []byte, cfg writeConfig) (_ reply, err error) {
	if err := check(ctx, key); err != nil {
		return reply{}, err
	}
	if expected < 0 {
		return reply{}, fmt.Errorf("%w: negative expected version %d", errInvalidOption, expected)
	}
	spanOp := "cas-set"
	if op == "del" {
		spanOp = "cas-del"
	}
	ctx, span := s.tel.start(ctx, spanOp, key, nil)
	defer func() { s.tel.end(ctx, span, err) }()
	vkey := s.redisKey(key)
	sent := newSendCount(millis(s.retryWindow), s.knownClient)
	var cmd rediscmd.Reply
	if op == "set" {
		cmd = s.run(ctx, casScript, []string{vkey, recordKey(vkey, s.callID())},
			op, strconv.FormatInt(expected, 10), millis(s.retention), sent, data, millis(cfg.ttl))
	} else {
		cmd = s.run(ctx, casScript, []string{vkey, recordKey(vkey, s.callID())},
			op, strconv.FormatInt(expected, 10), millis(s.retention), sent)
	}
	r, err := s.decode(ctx, "compare-and-"+op, key, cmd, sent)
	if err != nil {
		return reply{}, err
	}
	if r.status == "CONFLICT" {
		return reply{}, fmt.Errorf("storage/redis: compare-and-%s: %w", op, &fence.ConflictError{Key: key, Expected: expected, Actual: r.version})
	}
	return r, nil
}

// Modify is an optimistic read-modify-write that needs no lock: it reads key
// with [Store.Load], applies fn (to a Value with Exists false when the key
// holds none) and writes fn's result with [Store.CompareAndSet]. On a version
// conflict it waits a short random time and starts again, at most attempts
// times in all; it then returns the last [*fence.ConflictError]. It returns
// the value written.
//
// fn may run several times and must not have side effects beyond its result.
// Each result is written at most once, even when the client retries a write
// after losing its reply. An error from fn is returned as it is and nothing is
// written; a panic in fn writes nothing and reaches the caller unchanged. ctx
// bounds the whole call, waits included.
func (s *Store) Modify(ctx context.Context, key string, attempts int, fn func(old Value) ([]byte, error), opts ...WriteOption) (Value, error) {
	if attempts < 1 {
		return Value{}, fmt.Errorf("%w: %d attempts; at least 1 is needed", errInvalidOption, attempts)
	}
	if fn == nil {
		return Value{}, fmt.Errorf("%w: nil modify function", errInvalidOption)
	}
	cfg, err := writeOptions(opts)
	if err != nil {
		return Value{}, err
	}
	var last error
	for i := range attempts {
		if i > 0 {
			if err := backoff(ctx, i); err != nil {
				return Value{}, err
			}
		}
		old, err := s.Load(ctx, key)
		if err != nil && !errors.Is(err, fence.ErrNotFound) {
			return Value{}, err
		}
		data, err := fn(old)
		if err != nil {
			return Value{}, err
		}
		if data == nil {
			data = []byte{}
		}
		r, err := s.cas(ctx, "set", key, old.Version, data, cfg)
		if err == nil {
			return Value{Data: data, Version: r.version, ExpiresAt: r.expires, Exists: true}, nil
		}
		if !errors.Is(err, fence.ErrConflict) {
			return Value{}, err
		}
		last = err
	}
	return Value{}, fmt.Errorf("storage/redis: modify %q: gave up after %d attempts: %w", key, attempts, last)
}

// backoff waits a random time that grows with the attempt, up to about 10ms,
// so that writers that keep colliding spread out; it returns early with
// ctx's error.
func backoff(ctx context.Context, attempt int) error {
	limit := time.Duration(min(attempt, 10)) * time.Millisecond
	t := time.NewTimer(rand.N(limit) + time.Microsecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
