package redis

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/fencekit/fencekit/internal/rediscmd"
)

const (
	// DefaultPrefix is the key prefix used when [WithPrefix] is not given.
	DefaultPrefix = "fencekit:data:"

	// DefaultRetryWindow is how long a call's retry record is kept when
	// [WithRetryWindow] is not given and the client's options cannot be read
	// (a client other than a *goredis.Client or *goredis.ClusterClient, a
	// rueidis client among them). It
	// covers go-redis's retries with its default options, which may resend a
	// command up to about 232 s after its first run (see [WithRetryWindow]
	// for the formula). For those two clients the default window is derived
	// from their own options instead.
	DefaultRetryWindow = 4 * time.Minute

	// MinRetryWindow is the shortest retry window [WithRetryWindow] accepts,
	// and the window of a client that never retries.
	MinRetryWindow = time.Second

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
	client      rediscmd.StoreClient
	prefix      string
	retention   time.Duration
	retryWindow time.Duration
	windowSet   bool // by WithRetryWindow
	// knownClient says whether client is one whose options were read (into
	// plan); only such a client is known to write script arguments through
	// go-redis, which lets the store count a call's sends (see sendCount).
	knownClient bool
	plan        retryPlan
	// countsSends says whether the client marshals the send count at every
	// send of a command (every go-redis client that writes through go-redis
	// does; rueidis marshals a command's arguments once, before its first
	// send), so that a call sent once and refused is known not to have run.
	countsSends bool
	// calls runs the scripts so that each call returns by its context's
	// deadline whatever the client's options (see run).
	calls *rediscall.Calls

	// Every call that may change something names a retry record of its own
	// (see recordKey): a client retry of a call whose reply was lost finds
	// the record and reports the first run's outcome instead of running
	// again.
	storeID string // random per Store
	callSeq atomic.Uint64

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
			return fmt.Errorf("%w: empty key prefix (omit WithPrefix for %q)", errInvalidOption, DefaultPrefix)
		}
		if strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: key prefix %q contains a brace, which would change the keys' hash slots", errInvalidOption, prefix)
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
// at a price: once the hash is gone, any fence is admitted for the key again,
// and its version starts again from 0, so a [Store.CompareAndSet] that still
// holds a version read before is admitted once the key has been written back
// up to that version.
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
// Stores with different retentions may share keys: a hash lives as long as
// the longest retention of the stores that wrote it, and a store without
// retention keeps every hash it writes for ever, so a store with a shorter
// retention never lets Redis collect a mark that another keeps longer.
//
// d must be at least the retry window ([WithRetryWindow]): a retried fenced
// read checks its record against the version its hash holds, which a hash
// collected and written anew within the window could repeat. d must be at
// most [MaxDuration].
// Default: 0, the hash and its mark are kept forever.
func WithMarkRetention(d time.Duration) Option {
	return func(s *Store) error {
		if d < 0 {
			return fmt.Errorf("%w: negative mark retention %v", errInvalidOption, d)
		}
		if d > 0 && d < time.Millisecond {
			return fmt.Errorf("%w: mark retention %v is below one millisecond", errInvalidOption, d)
		}
		if d > MaxDuration {
			return fmt.Errorf("%w: mark retention %v is longer than %v", errInvalidOption, d, MaxDuration)
		}
		s.retention = d
		return nil
	}
}

// WithRetryWindow sets how long the store keeps the record of each call
// that changed something, so that a client's retry of a call whose reply was
// lost (go-redis sends a command again after a connection reset or a read
// timeout) gets the outcome of the first run, whatever other clients did in
// between, instead of running again. A retry that arrives after the window
// runs as a new call.
//
// [New] refuses a window shorter than the client's retry horizon, derived
// from its options: the longest time from a command's first run on the
// server to the arrival of its last resend. For go-redis v9.23 that is
//
//	MaxRetries × (ReadTimeout + MaxRetryBackoff + PoolTimeout
//	              + DialerRetries × DialTimeout + (DialerRetries − 1) × dial pause + DialTimeout
//	              + 3 × (WriteTimeout + ReadTimeout) + WriteTimeout)
//
// with go-redis's defaults and meanings applied to every field: each resend
// follows a failure that the client sees at most ReadTimeout after the
// previous send ran, then waits out its backoff, a pooled connection, a new
// connection's dial attempts (and one more dial timeout for a connection
// another goroutine is still setting up), that connection's three handshake
// round trips, and the write of the command. The dial pause is
// DialerRetryTimeout, or the longest DialerRetryBackoff gives. A
// *goredis.ClusterClient sends a command up to (MaxRedirects + 1) ×
// (MaxRetries + 1) times, so its MaxRetries in the formula is that product
// less one. With go-redis's defaults the horizon is about 232 s for a
// Client and a ClusterClient alike. A client that retries with its read,
// write or dial timeout disabled has no horizon, and [New] refuses it: set the timeouts, or turn
// retries off (MaxRetries -1, MaxRedirects -1).
//
// The options of any other client (a wrapper of your own, or a rueidis
// client given to lock/rueidisfence's NewStore) cannot be read: the store
// then accepts any window from [MinRetryWindow] and defaults to
// [DefaultRetryWindow]; choose d above that client's own retry horizon.
//
// The cost is memory for the window: one small key per call that changed
// something, about 155 bytes of server memory whatever the key's length,
// each expiring by itself. d must be between [MinRetryWindow] and
// [MaxRetryWindow]. Default: the client's retry horizon rounded up to a
// whole second (at least [MinRetryWindow]), or [DefaultRetryWindow] for a
// client whose options cannot be read.
func WithRetryWindow(d time.Duration) Option {
	return func(s *Store) error {
		if d < MinRetryWindow {
			return fmt.Errorf("%w: retry window %v is below %v", errInvalidOption, d, MinRetryWindow)
		}
		if d > MaxRetryWindow {
			return fmt.Errorf("%w: retry window %v is longer than %v", errInvalidOption, d, MaxRetryWindow)
		}
		s.retryWindow, s.windowSet = d, true
		return nil
	}
}

// New returns a store that runs its scripts on client: a *goredis.Client, a
// *goredis.ClusterClient or anything else that runs Lua scripts and sends
// each key to the one server that holds it. It reports an error for a nil
// client, an invalid option, or a retry window shorter than the client's
// retry horizon (see [WithRetryWindow]), and sends nothing.
//
// New refuses a *goredis.Ring, and a client of one's own that holds one in a
// field, with an error matching [fence.ErrInvalid]: a Ring sends the keys of
// a shard it marks down to another shard, which holds no high-water mark for
// them and would admit a stale fence. Wrap a Ring more deeply and New cannot
// see it; the store is then as unsafe as the Ring.
func New(client goredis.Scripter, opts ...Option) (*Store, error) {
	if client == nil || isNilPointer(client) {
		return nil, fmt.Errorf("%w: nil Redis client", errInvalidOption)
	}
	if err := refuseRing(client); err != nil {
		return nil, err
	}
	plan, known := planOf(client)
	return open(newGoRedis(client), opts, plan, known, true)
}

func init() {
	rediscmd.NewStore = func(c rediscmd.StoreClient, opts []any) (any, error) {
		o := make([]Option, len(opts))
		for i, opt := range opts {
			var ok bool
			if o[i], ok = opt.(Option); !ok {
				return nil, fmt.Errorf("%w: %T is not a storage/redis Option", errInvalidOption, opt)
			}
		}
		return open(c, o, retryPlan{}, false, false)
	}
}

// open returns a store on c: plan is the client's retry plan when known;
// counts says whether c marshals the send count at every send.
func open(c rediscmd.StoreClient, opts []Option, plan retryPlan, known, counts bool) (*Store, error) {
	s := &Store{
		client: c, prefix: DefaultPrefix, storeID: newStoreID(), calls: rediscall.For(c.HonoursDeadlines()),
		plan: plan, knownClient: known, countsSends: counts,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", errInvalidOption)
		}
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	if err := s.setRetryWindow(); err != nil {
		return nil, err
	}
	if s.retention > 0 && s.retention < s.retryWindow {
		// Redis would collect the hash before the retries of a fenced read
		// stopped coming, and a hash written anew could then pass for the
		// one that read saw.
		return nil, fmt.Errorf("%w: mark retention %v is shorter than the retry window %v", errInvalidOption, s.retention, s.retryWindow)
	}
	tel, err := newInstruments(s.meters, s.tracers)
	if err != nil {
		return nil, err
	}
	s.tel = tel
	return s, nil
}

// setRetryWindow derives the retry window from the client's options, or
// checks the one given against them.
func (s *Store) setRetryWindow() error {
	if !s.knownClient {
		if !s.windowSet {
			s.retryWindow = DefaultRetryWindow
		}
		return nil
	}
	horizon, err := s.plan.horizon()
	if err != nil {
		return err
	}
	if !s.windowSet {
		s.retryWindow = max(horizon.Truncate(time.Second), MinRetryWindow)
		if s.retryWindow < horizon {
			s.retryWindow += time.Second
		}
		if s.retryWindow > MaxRetryWindow {
			return fmt.Errorf("%w: the client may resend a command up to %v after its first run, longer than the longest retry window %v: shorten its timeouts or retries", errInvalidOption, horizon, MaxRetryWindow)
		}
		return nil
	}
	if s.retryWindow < horizon {
		return fmt.Errorf("%w: retry window %v is shorter than the client's retry horizon %v (the longest time from a command's first run to its last resend, from the client's options); a resend after the window would run again", errInvalidOption, s.retryWindow, horizon)
	}
	return nil
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
	for _, sc := range []*rediscmd.Script{fencedScript, casScript, loadScript} {
		if err := s.loadScript(ctx, sc); err != nil {
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
			return fmt.Errorf("%w: value TTL %v is below one millisecond", errInvalidOption, d)
		}
		if d > MaxDuration {
			return fmt.Errorf("%w: value TTL %v is longer than %v; omit WithTTL for a value that does not expire", errInvalidOption, d, MaxDuration)
		}
		c.ttl = d
		return nil
	}
}

func writeOptions(opts []WriteOption) (writeConfig, error) {
	var c writeConfig
	for _, opt := range opts {
		if opt == nil {
			return c, fmt.Errorf("%w: nil write option", errInvalidOption)
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
		return fmt.Errorf("%w: nil context (use context.Background or context.TODO)", errInvalidOption)
	}
	return ctx.Err()
}

// check validates what every call shares, before anything is sent.
func check(ctx context.Context, key string) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: empty key", errInvalidKey)
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

// millis rounds d up to whole milliseconds; options keep d within
// [MaxDuration], far from overflowing.
func millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}
