package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// DefaultPrefix is the key prefix used when [WithPrefix] is not given.
const DefaultPrefix = "fencekit:data:"

// Store keeps byte values in Redis, one hash per value, and admits reads and
// writes by fence and by version. A Store is safe for concurrent use; its
// zero value is not usable, call [New].
type Store struct {
	client    goredis.Scripter
	prefix    string
	retention time.Duration

	// Version-checked writes carry an id, unique to the call, that the value
	// hash keeps: a client retry of a write whose reply was lost finds its
	// own id and reports the write's success instead of a version conflict.
	writeIDs string // random per Store
	writeSeq atomic.Uint64
}

// Value is the state of one key as a store operation saw it.
type Value struct {
	// Data is the value's bytes; nil when Exists is false.
	Data []byte
	// Version counts the writes and deletes of the key: 0 before the first
	// write, then one more with every write, every delete of a live value
	// and every expiry. It never goes back while the key's hash exists.
	Version int64
	// ExpiresAt is when the value expires, by the Redis server's clock; the
	// zero time means it does not expire.
	ExpiresAt time.Time
	// Exists reports whether the key held a live value.
	Exists bool
}

// Option configures a [Store]; each option validates its argument.
type Option func(*Store) error

// WithPrefix sets the prefix put before every key. It must be non-empty and
// must not contain '{' or '}', so that a hash tag in a caller's key (such as
// "{user42}:cart") stays the key's Redis Cluster hash tag.
// Default: [DefaultPrefix].
func WithPrefix(prefix string) Option {
	return func(s *Store) error {
		if prefix == "" {
			return fmt.Errorf("%w: empty key prefix (omit WithPrefix for %q)", ErrInvalidOption, DefaultPrefix)
		}
		if strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: key prefix %q contains a brace, which would change the keys' hash slots", ErrInvalidOption, prefix)
		}
		s.prefix = prefix
		return nil
	}
}

// WithMarkRetention lets Redis drop the hash of a key that holds no live
// value, high-water mark and all, once d has passed since its value expired
// or was deleted and since the last operation on it that found no live value.
// A key whose value is live and does not expire is kept.
//
// This bounds the memory of deleted, expired and read-but-never-written keys,
// at a price: once the hash is gone, any fence is admitted for the key again.
// A holder that waits longer than d between its fenced read and its fenced
// write of a missing value, or an old holder that wakes up after the key has
// gone d without a value and without operations, is admitted. Choose d far
// longer than any pause a holder can survive. Default: 0, the hash and its
// mark are kept forever.
func WithMarkRetention(d time.Duration) Option {
	return func(s *Store) error {
		if d < 0 {
			return fmt.Errorf("%w: negative mark retention %v", ErrInvalidOption, d)
		}
		if d > 0 && d < time.Millisecond {
			return fmt.Errorf("%w: mark retention %v is below one millisecond", ErrInvalidOption, d)
		}
		s.retention = d
		return nil
	}
}

// New returns a store that runs its scripts on client: a *goredis.Client, a
// *goredis.ClusterClient or anything else that runs Lua scripts. It reports
// an error for a nil client or an invalid option, and sends nothing.
func New(client goredis.Scripter, opts ...Option) (*Store, error) {
	if client == nil || isNilPointer(client) {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOption)
	}
	s := &Store{client: client, prefix: DefaultPrefix, writeIDs: randomID()}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Prefix returns the prefix the store puts before every key.
func (s *Store) Prefix() string { return s.prefix }

// Preload loads the store's scripts into the server (into every master of a
// cluster), so that the first call of each operation is also a single
// command. It is optional: without it, the first call of a script on a
// server sends EVALSHA, then EVAL. ctx bounds the loading.
func (s *Store) Preload(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, sc := range []*goredis.Script{fencedScript, casScript, loadScript} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("storage/redis: load scripts: %w", err)
		}
	}
	return nil
}

// WriteOption adjusts one write.
type WriteOption func(*writeConfig) error

type writeConfig struct {
	ttl time.Duration
}

// WithTTL makes the written value expire after d, by the Redis server's
// clock, with millisecond precision. An expired value reads as missing and
// counts as deleted at its expiry (its version moves on by one), but the
// key's high-water mark stays (see [WithMarkRetention]). Default: no expiry.
func WithTTL(d time.Duration) WriteOption {
	return func(c *writeConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: value TTL %v is below one millisecond", ErrInvalidOption, d)
		}
		c.ttl = d
		return nil
	}
}

func writeOptions(opts []WriteOption) (writeConfig, error) {
	var c writeConfig
	for _, opt := range opts {
		if opt == nil {
			return c, fmt.Errorf("%w: nil write option", ErrInvalidOption)
		}
		if err := opt(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// check validates what every call shares, before anything is sent.
func check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return nil
}

// checkFenced adds the fence to [check].
func checkFenced(ctx context.Context, f fence.Fence, key string) error {
	if err := check(ctx, key); err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return fmt.Errorf("storage/redis: key %q: %w", key, err)
	}
	return nil
}

func (s *Store) redisKey(key string) string { return s.prefix + key }

// writeID returns an id unique to one version-checked write.
func (s *Store) writeID() string {
	return s.writeIDs + strconv.FormatUint(s.writeSeq.Add(1), 36)
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:]) + ":"
}

func millis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
