package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
	"github.com/redis/go-redis/v9"
)

// MaxTTL is the longest lease TryAcquire, Acquire, Do and Extend accept. A
// lease is a failure-detection window, not a bound on the work (renew it
// instead); a longer one is almost always a unit mistake, and one near
// math.MaxInt64 would silently never expire.
const MaxTTL = 365 * 24 * time.Hour

// Locker grants leases on named resources, each with a fencing token that
// strictly increases per resource, in the one token space every storage
// guard compares. It is safe for concurrent use; create one per backend (a
// Redis deployment, a set of Redlock masters, a PostgreSQL database, an
// etcd cluster) and share it, and call [Locker.Close] when done with it.
//
// A Locker holds its locks on a backend, chosen by its constructor: Redis,
// a server or a Cluster ([New]); Redlock's independent masters
// ([NewRedlock]); PostgreSQL (lock/pglock's New); etcd (lock/etcdlock's
// New, a module of its own); and the backends of lock's other subpackages.
// Everything above the backend (the Lease lifecycle, renewal, waiting,
// Owner holds, Do, telemetry, argument checks, the election) is the same
// code on each. What differs (what a failover does to leases, how waiters
// are woken, what is not offered) is said once, in the constructor's doc.
// A call or option a backend does not offer is refused with an error
// matching [fence.ErrInvalid], with nothing sent.
type Locker struct {
	b     lockbackend.Backend
	info  lockbackend.Info
	queue lockbackend.Queue // nil when Acquire polls (WithWait, or a backend without a queue)
	names redisNames        // nil on a backend without Redis keys
	wait  WaitStrategy

	// stop ends with Close: renewals run under it, so that Close cuts a
	// renewal call in flight short.
	stop     context.Context
	stopping context.CancelFunc

	tel       *instruments // OpenTelemetry instruments; nil records nothing
	closing   chan struct{}
	closeOnce sync.Once
	renewMu   sync.Mutex // orders renewers.Add and cleanups.Add against Close's Wait
	closed    bool
	renewers  sync.WaitGroup
	cleanups  sync.WaitGroup // see background
}

// redisNames is implemented by the backends whose state lives in Redis
// keys, for the key getters.
type redisNames interface {
	LockKey(resource string) string
	TokenKey(resource string) string
	Channel(resource string) string
}

// foreignFencer is implemented by the backend that fences foreign locks
// (FenceLock): a single Redis deployment.
type foreignFencer interface {
	FenceKey(lockKey string) string
	FenceLock(ctx context.Context, op, lockKey, value string, floor fence.Token) (fence.Fence, error)
}

// New returns a Locker on client. client may be a *redis.Client, a
// *redis.ClusterClient, a *redis.Ring or a failover client; every key of one
// resource carries the same hash tag, so a resource lives in one slot.
//
// Waiting ([Locker.Acquire]) on Redis: a waiter subscribes to the
// resource's release channel, and a try made once the subscription is
// confirmed that is refused also queues it; the release grants the lock to
// the first live waiter in its own script and announces the grant on the
// channel. A queued waiter tries again every second, which keeps its queue
// entry alive; the first three of the queue also when the current lease's
// remaining time runs out (a holder that vanished), 20ms apart. The
// Locker's waiters share one subscription connection (on a cluster, one per
// hash slot with waiters). If the subscription fails, waiters retry on the
// timed [Backoff] schedule, never sleeping past the current lease's
// remaining time, until it is back. The package doc describes the queue's
// keys and its treatment of waiters that vanish.
//
// A restart without persistence, or a failover to a replica that missed the
// last writes, loses leases (a second holder can then be granted while the
// first still works); tokens keep rising through the server's clock (see
// Tokens and lost data in the package doc). A Locker from New offers
// everything: [Owner] holds, [Locker.FenceLock], [Locker.Advance] and the
// election's Proclaim; [WithNodeTimeout] is Redlock's and is refused.
//
// A Ring moves a resource to another shard while it counts the resource's
// shard as down (a few missed heartbeats) and back when that shard answers
// again, and no shard knows what the other granted: each move is a loss of
// the lock's data, and a second holder may be granted while the first still
// holds its lease (see Tokens and lost data in the package doc). Storage
// fencing keeps their writes apart, but keep the fenced data off the Ring:
// storage/redis refuses one.
func New(client redis.UniversalClient, opts ...Option) (*Locker, error) {
	if isNil(client) {
		return nil, fmt.Errorf("%w: nil Redis client", errInvalid)
	}
	return open(opts, func(s lockbackend.Settings) (lockbackend.Backend, error) { return redisbackend.New(client, s) })
}

// open reads opts, makes the backend from them and returns a Locker on it:
// the one constructor behind New, NewRedlock and the backend packages.
func open(opts []Option, mk lockbackend.Opener) (*Locker, error) {
	c := config{prefix: DefaultPrefix, wait: Backoff(time.Millisecond, 64*time.Millisecond), retention: DefaultTokenRetention}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	l := &Locker{wait: c.wait, closing: make(chan struct{})}
	b, err := mk(lockbackend.Settings{Prefix: c.prefix, Retention: c.retention, Poll: c.poll, NodeTimeout: c.perNode,
		Given: c.given, Background: l.background, Meters: c.meters})
	if err != nil {
		return nil, err
	}
	if l.tel, err = c.instruments(); err != nil {
		b.Close(time.Now())
		return nil, err
	}
	l.b, l.info = b, b.Info()
	if q, ok := b.(lockbackend.Queue); ok && l.info.Queue && !c.poll {
		l.queue = q
	}
	l.names, _ = b.(redisNames)
	l.stop, l.stopping = context.WithCancel(context.Background())
	return l, nil
}

// The hooks of package lockbackend: backend packages (lock/pglock) make a
// Locker through Open, and packages that build on a Locker (election)
// reach its backend through Of.
func init() {
	lockbackend.Open = func(mk lockbackend.Opener, opts []any) (any, error) {
		os := make([]Option, 0, len(opts))
		for i, o := range opts {
			switch o := o.(type) {
			case Option:
				os = append(os, o)
			case nil:
			default:
				return nil, fmt.Errorf("%w: option %d is a %T, not a lock.Option", errInvalid, i, o)
			}
		}
		return open(os, mk)
	}
	lockbackend.Of = func(v any) lockbackend.Backend {
		if l, ok := v.(*Locker); ok && l != nil {
			return l.b
		}
		return nil
	}
	lockbackend.Closed = func(v any) bool {
		l, ok := v.(*Locker)
		if !ok || l == nil {
			return false
		}
		l.renewMu.Lock()
		defer l.renewMu.Unlock()
		return l.closed
	}
}

// Close stops the Locker's subscription connections and the renewal of its
// leases, and waits for their goroutines to return, and for the cleanup
// that calls left to the background when their context ended (a release
// asked for with an ended context, a waiter leaving the queue, the release
// of a grant whose reply was lost), each bounded by a short timeout of its
// own (2 s). It does not release any lease: renewed leases run out their TTL
// (their [Lease.Done] closes then), and a Lease can still be released.
// After Close the Locker still grants leases, and Acquire waits by timed
// retries on its wait strategy, as with [WithWait] ([Backoff] from 1 to
// 64 ms by default: about 30 tries a second), which respect the queue but
// no longer join it: a waiter queued when Close is called leaves the queue
// at once (a grant made to it meanwhile is handed on), since no grant
// message can reach it any more. On
// a Locker made by [NewRedlock], Close also waits for the calls to its
// nodes that are still in flight (a node's late answer to an acquisition
// is released from its own goroutine).
//
// Close returns within that bound (2 s) whatever the client's options.
// With a client that ignores context deadlines (go-redis without
// ContextTimeoutEnabled), a call to a server that went silent stays in the
// client after fencekit's caller returned, until the client's read timeout
// (5 s by default) or until the client is closed; Close waits for such
// calls, and for the release that follows an acquisition among them, only
// within the bound, and leaves the rest to the client. The same holds for
// a subscription connection that broke and is being made again on a
// silent server (go-redis holds the subscription through the dial and
// handshake, up to its read timeout): Close waits for its goroutines only
// within the bound. Calls started after Close are not waited for. Close is
// idempotent.
func (l *Locker) Close() {
	l.closeOnce.Do(func() {
		deadline := time.Now().Add(cleanupTimeout)
		l.renewMu.Lock()
		l.closed = true
		l.renewMu.Unlock()
		close(l.closing)
		l.stopping()
		lockbackend.WaitUntil(&l.renewers, deadline)
		lockbackend.WaitUntil(&l.cleanups, deadline)
		// After the renewals, whose extensions the backend's calls may be.
		l.b.Close(deadline)
	})
}

func isNil(c redis.UniversalClient) bool { return redisbackend.IsNil(c) }

// checkCall refuses a nil or finished context before anything is sent; op
// and resource label the error.
func checkCall(ctx context.Context, op, resource string) error {
	if ctx == nil {
		return fmt.Errorf("%w: %s %q: nil context", errInvalid, op, resource)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lock: %s %q: %w", op, resource, err)
	}
	return nil
}

func checkResource(resource string) error {
	if resource == "" {
		return fmt.Errorf("%w: empty resource name", errInvalid)
	}
	if len(resource) > fence.MaxResourceLen {
		return fmt.Errorf("%w: resource name of %d bytes is longer than %d", errInvalid, len(resource), fence.MaxResourceLen)
	}
	if err := (fence.Fence{Resource: resource, Token: 1, Holder: "h"}).Validate(); err != nil {
		// The same rule storage applies, so a lease is never refused later.
		return fmt.Errorf("%w: %w", errInvalid, err)
	}
	if strings.ContainsAny(resource, "{}") {
		return fmt.Errorf("%w: resource %q contains a brace, which would break its hash tag", errInvalid, resource)
	}
	return nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: lease %v is shorter than 1ms", errInvalid, ttl)
	}
	if ttl > MaxTTL {
		return fmt.Errorf("%w: lease %v is longer than %v", errInvalid, ttl, MaxTTL)
	}
	return nil
}

// TryAcquire makes one attempt to lock resource for ttl (at least 1ms; every
// backend counts leases in whole milliseconds, so a fraction of one is
// dropped, from the lease sent and from the lease counted alike). The grant
// and the next token come from one round trip to the backend (a script on
// Redis, a statement on PostgreSQL, a transaction on etcd; Redlock asks
// every node at once, then raises their token state, see [NewRedlock]).
// When another holder has the lock, or the lock is free but live waiters
// are queued for it in [Locker.Acquire] (it then goes to the first of
// them), it returns a [*NotAcquiredError] at once.
//
// ctx bounds the round trip, and TryAcquire returns by its deadline (see
// the package doc for a server that does not answer at all). If ctx
// ends or the connection fails while the reply is in flight, whatever the
// attempt may have taken is released, so no lock is left that the caller
// does not know about: within ctx while it lasts, and in the background
// (bounded by a short timeout of its own, and waited for by
// [Locker.Close]) once it has ended; the error then matches ctx.Err() when
// ctx ended. Where the client sends the attempt again after a lost reply
// (go-redis's retries, pglock's resend on another connection), the resend
// returns the grant the first run made rather than refusing it. opts apply
// to this acquisition (see [AutoRenew] and [Owner]).
func (l *Locker) TryAcquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	cfg, ttl, err := l.checkAcquire(ctx, resource, ttl, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, span := l.tel.startAcquire(ctx, "fencekit.lock.try_acquire", resource, false)
	lease, err := l.tryAcquire(ctx, resource, ttl, cfg, &attempt{holder: fence.NewHolder(), ordered: true, once: true})
	l.tel.endAcquire(ctx, span, start, false, lease, err)
	return lease, err
}

// checkAcquire refuses invalid arguments before anything is sent, and
// returns ttl in the whole milliseconds Redis keeps.
func (l *Locker) checkAcquire(ctx context.Context, resource string, ttl time.Duration, opts []AcquireOption) (acquireConfig, time.Duration, error) {
	if err := checkResource(resource); err != nil {
		return acquireConfig{}, 0, err
	}
	if err := checkTTL(ttl); err != nil {
		return acquireConfig{}, 0, err
	}
	cfg, err := newAcquireConfig(opts)
	if err != nil {
		return cfg, 0, err
	}
	return cfg, wholeMS(ttl), checkCall(ctx, "acquire", resource)
}

// wholeMS drops the fraction of a millisecond from a lease: Redis keeps
// expiries in whole milliseconds (PX, PEXPIRE), so that is all a lease can
// be sent as, and counting the fraction locally would report validity after
// Redis let the key go. Every ttl is cut here once, on the way in, so the
// same value is sent and counted by the grant, a hand-over, Extend, renewal
// and Redlock's validity.
func wholeMS(ttl time.Duration) time.Duration { return ttl.Truncate(time.Millisecond) }

// attempt is what the tries of one acquisition share: the holder id they
// offer and, for a waiter in Acquire, its place in the resource's wait
// queue.
type attempt struct {
	holder string
	// ordered says the tries respect the wait queue: a free lock with live
	// waiters queued ahead goes to the first of them. Every try of Acquire
	// and TryAcquire does.
	ordered bool
	queue   bool // a refused try queues the holder (or refreshes its entry)
	once    bool // TryAcquire's single try (see lockbackend.Request.Once)
	// head says the last refused try left the holder first in the queue.
	head bool
	// place is the holder's place in the queue as of the last refused try
	// (0: the head; -1: unknown): only the first few have a reason to try
	// again when the current lease ends (see wait.go).
	place int64
	// ref and sent name the holder's queue entry as of the last refused
	// try: the server clock (µs) the entry was refreshed at, and when that
	// try was sent. ref is 0 until a try has queued the holder.
	ref  int64
	sent time.Time
}

// queued reports whether a try has put the holder in the queue.
func (a *attempt) queued() bool { return a.ref != 0 }

func (l *Locker) tryAcquire(ctx context.Context, resource string, ttl time.Duration, cfg acquireConfig, a *attempt) (*Lease, error) {
	if cfg.owner != "" && !l.info.Owner {
		return nil, fmt.Errorf("%w: acquire %q: Owner is not supported by the %s backend", lockbackend.ErrUnsupported, resource, l.info.Name)
	}
	// The Lease is made first and carries the request, which would
	// otherwise be an allocation of its own (a call through an interface
	// lets its argument escape).
	lease := &Lease{l: l}
	lease.req = lockbackend.Request{Resource: resource, TTL: ttl, Holder: a.holder, Owner: cfg.owner, Ordered: a.ordered, Queue: a.queue, Once: a.once}
	sent := time.Now()
	out, err := l.b.Try(ctx, &lease.req)
	if err != nil {
		return nil, err
	}
	if !out.Granted {
		if out.Ref != 0 {
			a.ref, a.sent = out.Ref, sent
			a.head, a.place = out.Place == 0, out.Place
		}
		return nil, &NotAcquiredError{Resource: resource, Remaining: out.Remaining}
	}
	if out.StateMissed {
		l.tel.stateMissed(ctx)
	}
	lease.hold = out.Hold
	l.grantLease(lease, fence.Fence{Resource: resource, Token: out.Token, Holder: out.Holder}, sent, out.Known, ttl, cfg)
	return lease, nil
}

// grantLease fills in lease for a grant of f that the backend holds for at
// least known from start, on the local clock.
func (l *Locker) grantLease(lease *Lease, f fence.Fence, start time.Time, known, ttl time.Duration, cfg acquireConfig) {
	lease.granted = start
	lease.f = f
	// An owner's holds share the lock and each may extend it, so only a
	// renewed one can tell from the clock that it ran out.
	lease.start(start, known, cfg.owner == "" || cfg.autoRenew)
	if cfg.autoRenew {
		lease.startRenewal(ttl)
	}
}

// cleanup undoes what an acquisition whose reply was lost, or a waiter
// that gave up, may hold: the grant of holder, or with an owner the hold
// acq, and holder's place in the queue (see lockbackend.Backend.Abandon).
//
// While ctx lasts it runs within ctx; what ctx leaves undone (it ended, or
// the reply was lost again) goes on in the background, bounded by
// cleanupTimeout, so the caller returns by its deadline and [Locker.Close]
// waits for the rest.
func (l *Locker) cleanup(ctx context.Context, resource, holder, acq string) {
	if ctx.Err() == nil {
		if err := l.b.Abandon(ctx, resource, holder, acq); !errors.Is(err, lockbackend.ErrReplyLost) {
			return
		}
	}
	l.background(ctx, func(ctx context.Context) { _ = l.b.Abandon(ctx, resource, holder, acq) })
}

// Acquire locks resource for ttl, waiting while another holder has it, until
// it succeeds or ctx ends.
//
// On a backend with a queue (Redis and Redis Cluster from [New], PostgreSQL,
// etcd) it waits in the resource's queue: a refused try queues it, and the
// release that frees the lock grants it to the first live waiter (first
// come, first served, across processes) and tells that waiter, so Acquire
// returns the lease with no further round trip. The lease's
// [Lease.Validity] is counted from no later than the grant. Every try
// respects the queue, including the first: a free lock with live waiters
// queued ahead goes to the first of them, and this try is refused. A waiter
// that vanished costs those behind it a bounded time (its constructor's doc
// says how long). On a backend without a queue (Redlock), and with
// [WithWait] on any backend, Acquire polls on that strategy instead, in no
// particular order. How each backend tells its waiters (a Redis channel, a
// PostgreSQL NOTIFY, an etcd watch) is in its constructor's doc; for Redis
// see [New].
//
// ctx bounds the whole wait, and Acquire returns by its deadline. When it
// ends, Acquire returns an error that matches ctx.Err() and holds no lock:
// it leaves the queue in the background (one round trip, bounded by its own
// short timeout; [Locker.Close] waits for it), and a grant that reached it
// meanwhile is released to the next waiter. opts apply to the acquisition, as
// for [Locker.TryAcquire].
func (l *Locker) Acquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	cfg, ttl, err := l.checkAcquire(ctx, resource, ttl, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, span := l.tel.startAcquire(ctx, "fencekit.lock.acquire", resource, true)
	lease, err := l.acquireWaiting(ctx, resource, ttl, cfg)
	l.tel.endAcquire(ctx, span, start, true, lease, err)
	return lease, err
}

// Advance raises resource's token counter to at least atLeast and never
// lowers it, so that the next grant's token is above atLeast. Lost token
// state heals by itself (see the package doc); Advance is for a Redis server
// whose clock went back past the tokens storage has seen, which storage
// reports as a [*fence.StaleError] whose HighWater says how far to advance.
// atLeast must be below [fence.MaxToken]. After a stale refusal, redo the
// whole unit of work from its fenced read under a new grant; never retry
// only the refused write.
//
// ctx bounds the one round trip. Advance does not touch the lock itself.
func (l *Locker) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	if err := checkResource(resource); err != nil {
		return err
	}
	if atLeast < 0 || atLeast >= fence.MaxToken {
		return fmt.Errorf("%w: token %d is outside [0, fence.MaxToken)", errInvalid, atLeast)
	}
	if err := checkCall(ctx, "advance", resource); err != nil {
		return err
	}
	adv, ok := l.b.(lockbackend.Advancer)
	if !ok {
		return fmt.Errorf("%w: advance %q: the %s backend has no token counter to raise", lockbackend.ErrUnsupported, resource, l.info.Name)
	}
	return adv.Advance(ctx, resource, atLeast)
}
