package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

const (
	// DefaultPrefix is the key prefix used when [WithPrefix] is not given.
	DefaultPrefix = "fencekit:data:"

	// DefaultRetryWindow is how long a write's outcome is kept for client
	// retries when [WithRetryWindow] is not given. It outlasts go-redis's
	// retries with their default timeouts (3 retries, each within a 5 s dial,
	// a 3 s write and a 3 s read, and at most 512 ms of backoff: about 35 s
	// after the first run).
	DefaultRetryWindow = time.Minute

	// MaxRetryWindow is the longest retry window [WithRetryWindow] accepts.
	// Records cost memory for every write of the window; no client retries
	// a command a day later.
	MaxRetryWindow = 24 * time.Hour

	// MaxDuration is the longest value lifetime ([WithTTL]) and mark
	// retention ([WithMarkRetention]) the store accepts: 100 years of 365
	// days. It keeps expiry times, in milliseconds of the Redis server's
	// clock, far from overflowing; a value that must not expire takes no
	// TTL at all.
	MaxDuration = 100 * 365 * 24 * time.Hour
)

// Store keeps byte values in Redis, one hash per value, and admits reads and
// writes by fence and by version. A Store is safe for concurrent use; its
// zero value is not usable, call [New].
type Store struct {
	client      goredis.Scripter
	prefix      string
	retention   time.Duration
	retryWindow time.Duration

	// Every write carries an id unique to the call, under which the value
	// hash records the write's reply for the retry window: a client retry of
	// a write whose reply was lost finds it and reports the first run's
	// outcome instead of running again.
	writeIDs string // random per Store
	writeSeq atomic.Uint64

	meters  metric.MeterProvider
	tracers trace.TracerProvider
	tel     *instruments
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
// longer than any pause a holder can survive. A refused operation also
// restarts the retention, so an old holder that keeps retrying keeps the mark
// that refuses it; it is admitted only once it has stayed away for d.
//
// A hash with a retention carries a Redis TTL whenever it holds no live value
// or an expiring one. Under a volatile-* maxmemory-policy (volatile-lru,
// volatile-lfu, volatile-random, volatile-ttl) Redis may then evict it before
// d has passed, mark included, and admit old fences early; under allkeys-*
// it may evict any hash, with or without a retention. Run a store's Redis
// with maxmemory-policy noeviction (writes then fail when memory is full,
// and no mark is lost), or keep the store's keys on a server whose policy
// never evicts them. Without a retention the store's hashes carry no TTL, so
// volatile-* policies leave them alone.
//
// d must be at least the retry window ([WithRetryWindow]), since the hash
// holds the records of its recent writes, and at most [MaxDuration].
// Default: 0, the hash and its mark are kept forever.
func WithMarkRetention(d time.Duration) Option {
	return func(s *Store) error {
		if d < 0 {
			return fmt.Errorf("%w: negative mark retention %v", ErrInvalidOption, d)
		}
		if d > 0 && d < time.Millisecond {
			return fmt.Errorf("%w: mark retention %v is below one millisecond", ErrInvalidOption, d)
		}
		if d > MaxDuration {
			return fmt.Errorf("%w: mark retention %v is longer than %v", ErrInvalidOption, d, MaxDuration)
		}
		s.retention = d
		return nil
	}
}

// WithRetryWindow sets how long the store remembers the outcome of each
// write, so that a client's retry of a write whose reply was lost (go-redis
// retries after a connection reset or a read timeout, 3 times by default)
// gets the outcome of the first run, whatever other clients did in between,
// instead of running again. Choose d longer than the longest time a client
// may take to retry: its dial, write and read timeouts and its backoff, over
// all its retries. A retry that arrives later runs as a new write.
//
// The cost is memory: every write keeps a record of up to about 170 bytes
// in its key's hash for d, and each later write of the key drops a few
// expired records, so a key holds about as many records as it had writes in
// the last d. d must be between one second and [MaxRetryWindow].
// Default: [DefaultRetryWindow].
func WithRetryWindow(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Second {
			return fmt.Errorf("%w: retry window %v is below one second, shorter than client retries take", ErrInvalidOption, d)
		}
		if d > MaxRetryWindow {
			return fmt.Errorf("%w: retry window %v is longer than %v", ErrInvalidOption, d, MaxRetryWindow)
		}
		s.retryWindow = d
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
	s := &Store{client: client, prefix: DefaultPrefix, retryWindow: DefaultRetryWindow, writeIDs: randomID()}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	if s.retention > 0 && s.retention < s.retryWindow {
		// Redis would collect the hash, and the records of its writes with
		// it, before their retries stopped coming.
		return nil, fmt.Errorf("%w: mark retention %v is shorter than the retry window %v", ErrInvalidOption, s.retention, s.retryWindow)
	}
	tel, err := newInstruments(s.meters, s.tracers)
	if err != nil {
		return nil, err
	}
	s.tel = tel
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
	if err := checkContext(ctx); err != nil {
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
// key's high-water mark stays (see [WithMarkRetention]). d must be between
// one millisecond and [MaxDuration]. Default: no expiry.
func WithTTL(d time.Duration) WriteOption {
	return func(c *writeConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: value TTL %v is below one millisecond", ErrInvalidOption, d)
		}
		if d > MaxDuration {
			return fmt.Errorf("%w: value TTL %v is longer than %v; omit WithTTL for a value that does not expire", ErrInvalidOption, d, MaxDuration)
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

// checkContext refuses a nil or ended context, before anything is sent.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context (use context.Background or context.TODO)", ErrInvalidOption)
	}
	return ctx.Err()
}

// check validates what every call shares, before anything is sent.
func check(ctx context.Context, key string) error {
	if err := checkContext(ctx); err != nil {
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

// writeID returns an id unique to one write.
func (s *Store) writeID() string {
	return s.writeIDs + strconv.FormatUint(s.writeSeq.Add(1), 36)
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:]) + ":"
}

// millis rounds d up to whole milliseconds; options keep d within
// [MaxDuration], far from overflowing.
func millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}
