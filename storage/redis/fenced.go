package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rediscmd"
)

// FencedGet is a fenced read: it admits f by the fence rule (f's token above the
// key's high-water mark, or equal to it with the mark's holder), raises the
// mark to f and returns the key's value, all in one script and one round
// trip. Once FencedGet has admitted f, no fence older than f can write or delete
// the key.
//
// When the key holds no live value, FencedGet still raises the mark and returns an
// error matching [fence.ErrNotFound], together with a Value whose Version is
// the key's current version (for a later version-checked write).
//
// A refused fence gets a [*fence.StaleError] carrying the mark, or a
// [*ResourceError] when the key's mark was set for another resource; neither
// changes anything but the retention of the mark (see [WithMarkRetention]).
// A client retry of a FencedGet whose reply was lost and whose first run raised
// the mark is never refused: it returns what that run read, or an error
// matching [fence.ErrOutcomeUnknown] when the value has changed since (see
// the package doc's Retries). ctx bounds the call; a call that may have
// raised the mark and cannot tell also gets such an error.
//
// FencedGet fences key only: a later write to another key is not refused because
// a newer holder has since written this one. A write that depends on several
// keys must FencedGet each of them with the same fence first (see the package doc).
func (s *Store) FencedGet(ctx context.Context, f fence.Fence, key string) (Value, error) {
	r, err := s.fenced(ctx, "get", f, key, nil, writeConfig{}, -1)
	if err != nil {
		return Value{}, err
	}
	v := Value{Data: r.data, Version: r.version, ExpiresAt: r.expires, Exists: r.status == "OK"}
	if !v.Exists {
		return v, fmt.Errorf("storage/redis: get %q: %w", key, fence.ErrNotFound)
	}
	return v, nil
}

// FencedSet is a fenced write: it admits f by the fence rule, raises the key's
// high-water mark to f and stores data as the key's value with the next
// version, all in one script and one round trip. It returns the new version.
// [WithTTL] makes the value expire; without it the value is kept.
//
// A refused fence gets a [*fence.StaleError] carrying the mark (or a
// [*ResourceError]) and changes nothing. A client retry of a FencedSet whose reply
// was lost reports the first run's outcome (see [WithRetryWindow]). ctx
// bounds the call. When the call fails after its script may have run (ctx
// ended or the connection broke with the script in flight), the error
// matches [fence.ErrOutcomeUnknown] and its cause: read the key before
// writing again (see the package doc's Outcomes).
func (s *Store) FencedSet(ctx context.Context, f fence.Fence, key string, data []byte, opts ...WriteOption) (int64, error) {
	cfg, err := writeOptions(opts)
	if err != nil {
		return 0, err
	}
	r, err := s.fenced(ctx, "set", f, key, data, cfg, -1)
	if err != nil {
		return 0, err
	}
	return r.version, nil
}

// FencedSetIfVersion is [Store.FencedSet] that also requires the key's version to be
// expected, as read by [Store.FencedGet]: fence and version are both checked before
// anything is written. A version mismatch gets a [*fence.ConflictError] and
// changes nothing, not even the mark.
func (s *Store) FencedSetIfVersion(ctx context.Context, f fence.Fence, key string, expected int64, data []byte, opts ...WriteOption) (int64, error) {
	cfg, err := writeOptions(opts)
	if err != nil {
		return 0, err
	}
	if expected < 0 {
		return 0, fmt.Errorf("%w: negative expected version %d", errInvalidOption, expected)
	}
	r, err := s.fenced(ctx, "set", f, key, data, cfg, expected)
	if err != nil {
		return 0, err
	}
	return r.version, nil
}

// FencedDelete is a fenced delete: it admits f by the fence rule, raises the key's
// high-water mark to f and removes the key's value, in one script and one
// round trip. The mark itself stays (the key's hash keeps it, see
// [WithMarkRetention]), so an older holder's later write is still refused.
// Deleting a missing value is not an error; it still raises the mark.
//
// A refused fence gets a [*fence.StaleError] carrying the mark (or a
// [*ResourceError]) and changes nothing. A client retry of a FencedDelete whose
// reply was lost reports the first run's outcome, and deletes nothing written
// since. ctx bounds the call; an outcome it cannot tell gets an error
// matching [fence.ErrOutcomeUnknown], as for [Store.FencedSet].
func (s *Store) FencedDelete(ctx context.Context, f fence.Fence, key string) error {
	_, err := s.fenced(ctx, "del", f, key, nil, writeConfig{}, -1)
	return err
}

// FencedUpdate is a fenced read-modify-write: a fenced read of key ([Store.FencedGet]),
// fn applied to what it read (a Value with Exists false when the key holds
// none), and a fenced write of fn's result that also requires the version
// read ([Store.FencedSetIfVersion]). It returns the value written.
//
// Between the two round trips no other holder can write the key: one with
// an older fence is refused by the mark, and one with a newer fence makes
// the write fail with a [*fence.StaleError]. A version-checked write without
// a fence ([Store.CompareAndSet]) in between gives a [*fence.ConflictError].
// An error from fn is returned as it is and nothing is written, although the
// read has already raised the mark; a panic in fn writes nothing and reaches
// the caller unchanged. An error matching [fence.ErrOutcomeUnknown] means
// the read or the write may have applied: read again before deciding. ctx
// bounds the whole call.
func (s *Store) FencedUpdate(ctx context.Context, f fence.Fence, key string, fn func(old Value) ([]byte, error), opts ...WriteOption) (Value, error) {
	if fn == nil {
		return Value{}, fmt.Errorf("%w: nil update function", errInvalidOption)
	}
	cfg, err := writeOptions(opts)
	if err != nil {
		return Value{}, err
	}
	old, err := s.FencedGet(ctx, f, key)
	if err != nil && !errors.Is(err, fence.ErrNotFound) {
		return Value{}, err
	}
	data, err := fn(old)
	if err != nil {
		return Value{}, err
	}
	r, err := s.fenced(ctx, "set", f, key, data, cfg, old.Version)
	if err != nil {
		return Value{}, err
	}
	return Value{Data: data, Version: r.version, ExpiresAt: r.expires, Exists: true}, nil
}

// fenced runs the fenced script: op is "get", "set" or "del"; expected is
// the version to require, or -1 for none.
func (s *Store) fenced(ctx context.Context, op string, f fence.Fence, key string, data []byte, cfg writeConfig, expected int64) (_ reply, err error) {
	if err := checkFenced(ctx, f, key); err != nil {
		return reply{}, err
	}
	ctx, span := s.tel.start(ctx, op, key, &f)
	defer func() { s.tel.end(ctx, span, err) }()
	vkey := s.redisKey(key)
	keys := []string{vkey, recordKey(vkey, s.callID())}
	sent := newSendCount(millis(s.retryWindow), s.knownClient)
	tok := strconv.FormatInt(int64(f.Token), 10)
	var cmd rediscmd.Reply
	if op == "set" {
		exp := ""
		if expected >= 0 {
			exp = strconv.FormatInt(expected, 10)
		}
		if data == nil {
			data = []byte{}
		}
		cmd = s.run(ctx, fencedScript, keys, op, f.Resource, tok, f.Holder, millis(s.retention), sent,
			exp, data, millis(cfg.ttl))
	} else {
		cmd = s.run(ctx, fencedScript, keys, op, f.Resource, tok, f.Holder, millis(s.retention), sent)
	}
	r, err := s.decode(ctx, op, key, cmd, sent)
	if err != nil {
		return r, err
	}
	switch r.status {
	case "STALE":
		return r, fmt.Errorf("storage/redis: %s %q: %w", op, key, &fence.StaleError{Fence: f, HighWater: r.mark})
	case "RESOURCE":
		return r, &ResourceError{Key: key, Fence: f, Resource: r.res}
	case "CONFLICT":
		return r, fmt.Errorf("storage/redis: %s: %w", op, &fence.ConflictError{Key: key, Expected: expected, Actual: r.version})
	case "LOST":
		return r, &fence.OutcomeUnknownError{Op: fmt.Sprintf("storage/redis: %s %q", op, key), Err: errReadLost}
	}
	return r, nil
}
