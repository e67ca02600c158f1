package lock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

// MaxTTL is the longest lease TryAcquire, Acquire, Do and Extend accept. A
// lease is a failure-detection window, not a bound on the work (renew it
// instead); a longer one is almost always a unit mistake, and one near
// math.MaxInt64 would silently never expire.
const MaxTTL = 365 * 24 * time.Hour

// Locker grants leases on named resources, each with a fencing token. It is
// safe for concurrent use; create one per Redis deployment and share it, and
// call [Locker.Close] when done with it.
type Locker struct {
	client      redis.UniversalClient
	prefix      string
	wait        WaitStrategy
	retentionMS int64
	// The scripts' per-Locker arguments, converted to interface values once
	// rather than on every call.
	retentionArg any // retentionMS
	sharded      any // "1" when releases publish with SPUBLISH, else ""
	releaseMode  any // release.lua's ARGV[3]: "p" or "s" (SPUBLISH), then retentionMS

	red *redlock // the nodes of a Locker made by NewRedlock; nil for New

	// calls runs the calls to client so that each returns by its context's
	// deadline whatever the client's options, and counts those it left
	// running in the background (see package rediscall).
	calls *rediscall.Calls
	// stop ends with Close: renewals run under it, so that Close cuts a
	// renewal call in flight short.
	stop     context.Context
	stopping context.CancelFunc

	hub       *hub         // nil when Acquire polls (WithWait)
	tel       *instruments // OpenTelemetry instruments; nil records nothing
	closing   chan struct{}
	closeOnce sync.Once
	renewMu   sync.Mutex // orders renewers.Add and cleanups.Add against Close's Wait
	closed    bool
	renewers  sync.WaitGroup
	cleanups  sync.WaitGroup // see background
}

// New returns a Locker on client. client may be a *redis.Client, a
// *redis.ClusterClient, a *redis.Ring or a failover client; every key of one
// resource carries the same hash tag, so a resource lives in one slot.
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
	c := config{prefix: DefaultPrefix, wait: Backoff(time.Millisecond, 64*time.Millisecond), retention: DefaultTokenRetention}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.perNode != 0 {
		return nil, fmt.Errorf("%w: WithNodeTimeout is an option of NewRedlock", errInvalid)
	}
	tel, err := c.instruments()
	if err != nil {
		return nil, err
	}
	l := &Locker{client: client, prefix: c.prefix, wait: c.wait, retentionMS: c.retention.Milliseconds(), closing: make(chan struct{}), tel: tel,
		calls: rediscall.New(client)}
	l.stop, l.stopping = context.WithCancel(context.Background())
	l.retentionArg, l.sharded = l.retentionMS, ""
	mode := "p"
	if _, ok := client.(*redis.ClusterClient); ok {
		l.sharded, mode = "1", "s"
	}
	l.releaseMode = mode + strconv.FormatInt(l.retentionMS, 10)
	if !c.poll {
		l.hub = newHub(client)
	}
	return l, nil
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
		if l.hub != nil {
			l.hub.close(deadline)
		}
		waitUntil(&l.renewers, deadline)
		waitUntil(&l.cleanups, deadline)
		if l.red != nil {
			l.red.close(deadline) // after the renewals, whose extensions it waits for too
		}
		l.calls.Wait(deadline)
	})
}

func isNil(c redis.UniversalClient) bool {
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

// LockKey returns the Redis key that holds resource's lock: the prefix, the
// resource as a hash tag, and ":lock".
func (l *Locker) LockKey(resource string) string { return l.prefix + "{" + resource + "}:lock" }

// TokenKey returns the Redis key of resource's token state: the newest token
// issued and the current grant's token and holder. It shares the lock key's
// slot, release keeps it, and it expires the token retention (see
// [WithTokenRetention]) after the last lease ends.
func (l *Locker) TokenKey(resource string) string { return l.prefix + "{" + resource + "}:token" }

// ReleaseChannel returns the pub/sub channel on which the waiters of
// resource's lock hear of a release, in the same script that deletes the
// lock or hands it on: the prefix, the resource as a hash tag, and
// ":released". On a *redis.ClusterClient it is a sharded channel
// (SPUBLISH), in the slot of the resource's keys.
//
// A release publishes only when waiters are queued in [Locker.Acquire]:
// the grant to the first live one, or an empty message when none of them
// is live any more. A release with nobody queued publishes nothing, since
// no waiter needs the message (a lock made by [NewRedlock] publishes every
// release).
func (l *Locker) ReleaseChannel(resource string) string {
	return l.prefix + "{" + resource + "}:released"
}

func (l *Locker) channel(resource string) string { return l.ReleaseChannel(resource) }

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
func (l *Locker) resourceKeys(buf *[numKeys]string, resource string) (keys []string, channel string) {
	base := len(l.prefix) + len(resource) + 2
	suffixes := [...]string{":lock", ":token", ":holds", ":queue", ":waiting", ":released"}
	var b strings.Builder
	b.Grow(len(suffixes)*base + len(":lock:token:holds:queue:waiting:released"))
	var ends [len(suffixes)]int
	for i, suffix := range suffixes {
		b.WriteString(l.prefix)
		b.WriteByte('{')
		b.WriteString(resource)
		b.WriteByte('}')
		b.WriteString(suffix)
		ends[i] = b.Len()
	}
	all := b.String()
	from := 0
	for i := range numKeys {
		buf[i] = all[from:ends[i]]
		from = ends[i]
	}
	return buf[:], all[from:]
}

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

// TryAcquire makes one attempt to lock resource for ttl (at least 1ms; Redis
// keeps whole milliseconds, so a fraction of one is dropped, from the lease
// sent and from the lease counted alike). It costs one round trip: the
// grant and the next token come from one script. When another holder has
// the lock, or the lock is free but live waiters are queued for it in
// [Locker.Acquire] (it then goes to the first of them), it returns a
// [*NotAcquiredError] at once.
//
// ctx bounds the round trip, and TryAcquire returns by its deadline (see
// the package doc for a server that does not answer at all). If ctx
// ends or the connection fails while the reply is in flight, whatever the
// attempt may have taken is released, so no lock is left that the caller
// does not know about: within ctx while it lasts, and in the background
// (bounded by a short timeout of its own, and waited for by
// [Locker.Close]) once it has ended; the error then matches ctx.Err() when
// ctx ended. If the client
// retries the script after a lost reply, the retry returns the grant the
// first run made rather than refusing it. opts apply to this acquisition
// (see [AutoRenew] and [Owner]).
func (l *Locker) TryAcquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	cfg, ttl, err := l.checkAcquire(ctx, resource, ttl, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, span := l.tel.startAcquire(ctx, "fencekit.lock.try_acquire", resource, false)
	lease, err := l.tryAcquire(ctx, resource, ttl, cfg, &attempt{holder: fence.NewHolder(), ordered: true})
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
	if l.red != nil {
		return l.redlockAcquire(ctx, resource, ttl, cfg)
	}
	// The holder id is fresh for every acquisition. With an owner it also
	// names this acquisition in the hold record, so a retried re-entry is
	// recognised, and it becomes the holder only if this call takes the
	// lock afresh.
	holder := a.holder
	acq := ""
	if cfg.owner != "" {
		acq = holder
	}
	// The Lease is made first: it keeps the keys and the boxed
	// holder for its release, extensions and renewals.
	lease := &Lease{l: l, acq: acq}
	keys, channel := l.resourceKeys(&lease.keyBuf, resource)
	// Pointers into the Lease box without allocating (go-redis writes a
	// *string or *int64 as its value), where a string or a number would
	// each cost an allocation on every grant.
	lease.f.Holder = holder
	var holderArg any = &lease.f.Holder
	lease.tryMS = [2]int64{ttl.Milliseconds(), ttl.Milliseconds() + l.retentionMS}
	// A call cut short at ctx's end (see calls.go) may still take the lock:
	// late releases it once the call has returned.
	var late func(*redis.Cmd)
	if !l.calls.Direct(ctx) {
		late = l.lateCleanup(ctx, resource, a.holder, acq)
	}
	sent := time.Now()
	var (
		kind, n, third int64
		err            error
	)
	if cfg.owner == "" && !a.queue {
		// Without an owner and without joining the queue every reply is
		// numbers (the fast path's grant: the token as text), read without
		// boxing each one.
		// try.lua makes the grant with the fewest calls; only when it
		// finds the lock free with waiters queued does acquire.lua run, to
		// hand the lock to the first of them.
		var args []any
		if a.ordered {
			args = []any{"evalsha", tryHash, 3, &lease.keyBuf[keyLock], &lease.keyBuf[keyToken], &lease.keyBuf[keyQueue],
				holderArg, &lease.tryMS[0], &lease.tryMS[1]}
		} else {
			args = []any{"evalsha", tryHash, 2, &lease.keyBuf[keyLock], &lease.keyBuf[keyToken],
				holderArg, &lease.tryMS[0], &lease.tryMS[1]}
		}
		var cmd *redis.Cmd
		if late == nil {
			cmd = runScript(ctx, l.client, trySrc, args)
		} else {
			cmd = rediscall.Cmd(ctx, l.calls, func(ctx context.Context) *redis.Cmd { return runScript(ctx, l.client, trySrc, args) }, late)
		}
		if tok, ok := cmd.Val().(string); ok && cmd.Err() == nil {
			// try_fast.lua's grant: the token as text, followed by " 0"
			// when no token state was found.
			kind = 1
			digits, missed := strings.CutSuffix(tok, " 0")
			if n, err = strconv.ParseInt(digits, 10, 64); err != nil {
				err = fmt.Errorf("unexpected reply %q", tok)
			} else if missed {
				l.tel.stateMissed(ctx)
			}
		} else {
			var res []int64
			res, err = cmd.Int64Slice()
			if err == nil && len(res) == 1 && res[0] == 4 {
				res, err = l.script(ctx, late, acquireScript, keys,
					holderArg, ttl.Milliseconds(), l.retentionArg, "", "", channel, l.sharded).Int64Slice()
			}
			if err == nil && (len(res) < 2 || len(res) > 3 || res[0] > 1) {
				err = fmt.Errorf("unexpected reply %v", res)
			}
			if err == nil {
				kind, n = res[0], res[1]
				if len(res) == 3 {
					l.tel.stateMissed(ctx)
				}
			}
		}
	} else {
		var raw []any
		switch {
		case a.queue:
			raw, err = l.script(ctx, late, acquireScript, keys,
				holderArg, ttl.Milliseconds(), l.retentionArg, cfg.owner, queueLifeArg, channel, l.sharded).Slice()
		case a.ordered: // with an owner
			raw, err = l.script(ctx, late, acquireScript, keys,
				holderArg, ttl.Milliseconds(), l.retentionArg, cfg.owner, "", channel, l.sharded).Slice()
		default:
			raw, err = l.script(ctx, late, acquireScript, keys[:keyQueue],
				holderArg, ttl.Milliseconds(), l.retentionArg, cfg.owner).Slice()
		}
		if err == nil {
			var place int64
			if kind, n, third, place, err = parseAcquire(raw, &holder); kind == 2 {
				lease.f.Holder = holder // holderArg points at it
			} else if err == nil && kind == 1 && third == 1 {
				l.tel.stateMissed(ctx)
			} else if err == nil && kind == 0 && third > 0 {
				a.head, a.place = place == 0, place
			}
		}
	}
	if err != nil {
		if !isReply(err) && !rediscall.IsCut(err) {
			// The script may have run even though its reply was lost. (A
			// call cut short is cleaned up after by late, once it returns.)
			l.cleanup(ctx, resource, a.holder, acq)
		}
		return nil, translate(ctx, err, "acquire", resource)
	}
	if kind == 0 {
		if a.queue && third > 0 {
			a.ref, a.sent = third, sent
		}
		return nil, &NotAcquiredError{Resource: resource, Remaining: time.Duration(n) * time.Millisecond}
	}
	if n < 1 {
		// A retried grant whose token state vanished in between: its token
		// is unknown, so it cannot be used.
		l.cleanup(ctx, resource, a.holder, acq)
		return nil, fmt.Errorf("lock: acquire %q: the token state was lost during the grant; try again", resource)
	}
	known := ttl
	if kind == 3 {
		// A release granted the lock to this queued holder earlier; the
		// lease has what Redis says is left of it, counted from this try.
		known = time.Duration(max(third, 0)) * time.Millisecond
	}
	l.grantLease(lease, keys, holderArg, fence.Fence{Resource: resource, Token: fence.Token(n), Holder: holder}, sent, known, ttl, cfg)
	return lease, nil
}

// grantLease fills in lease for a grant of f that Redis holds for at least
// known from start, on the local clock.
func (l *Locker) grantLease(lease *Lease, keys []string, holderArg any, f fence.Fence, start time.Time, known, ttl time.Duration, cfg acquireConfig) {
	lease.key, lease.keys, lease.holderArg, lease.granted = keys[keyLock], keys, holderArg, start
	lease.f = f
	// An owner's holds share the lock and each may extend it, so only a
	// renewed one can tell from the clock that it ran out.
	lease.start(start, known, cfg.owner == "" || cfg.autoRenew)
	if cfg.autoRenew {
		lease.startRenewal(ttl)
	}
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

// cleanup releases what an acquisition whose reply was lost may have
// taken: the grant of holder, or with an owner the hold acq. It also takes
// holder out of the wait queue, and a grant a release made to it while it
// was queued is released (and handed on) too.
//
// While ctx lasts it runs within ctx; what ctx leaves undone (it ended, or
// the reply was lost again) goes on in the background, bounded by
// cleanupTimeout, so the caller returns by its deadline and [Locker.Close]
// waits for the rest.
func (l *Locker) cleanup(ctx context.Context, resource, holder, acq string) {
	if ctx.Err() == nil {
		if err := l.releaseAfter(ctx, resource, holder, acq); err == nil || isReply(err) {
			return
		}
	}
	l.background(ctx, func(ctx context.Context) { _ = l.releaseAfter(ctx, resource, holder, acq) })
}

// releaseAfter runs cleanup's release once, by ctx's end.
func (l *Locker) releaseAfter(ctx context.Context, resource, holder, acq string) error {
	var buf [numKeys]string
	keys, _ := l.resourceKeys(&buf, resource)
	if acq != "" {
		holder = "" // a re-entry's holder is the one the hold record names
	}
	return l.script(ctx, nil, releaseScript, keys, holder, acq, l.releaseMode, "1").Err()
}

// Acquire locks resource for ttl, waiting while another holder has it, until
// it succeeds or ctx ends.
//
// By default it waits in the resource's queue: it subscribes to the
// resource's [Locker.ReleaseChannel], and a try made once the subscription
// is confirmed that is refused also queues it, so the release that frees
// the lock grants it to this waiter (first come, first served, across
// processes) and announces the grant on the channel, from which Acquire
// returns the lease with no further round trip. The lease's [Lease.Validity]
// is counted from no later than the grant. Every try respects the queue,
// including the first, made before the subscription: a free lock with live
// waiters queued ahead goes to the first of them, and this try is refused.
// A queued waiter tries again every second, which keeps its queue entry
// alive; the first three of the queue also when the current lease's
// remaining time runs out (a holder that vanished), 20ms apart. The
// Locker's waiters share one subscription connection (on a cluster, one per
// hash slot with waiters). If the subscription fails, waiters retry on the
// timed [Backoff] schedule, never sleeping past the current lease's
// remaining time, until it is back. With [WithWait], Acquire polls on that
// strategy instead and does not queue. See the package doc for the queue's
// keys and its treatment of waiters that vanish.
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
	if l.red != nil {
		return l.redlockAdvance(ctx, resource, atLeast)
	}
	err := l.script(ctx, nil, advanceScript, []string{l.TokenKey(resource)}, int64(atLeast), l.retentionMS).Err()
	return translate(ctx, err, "advance", resource)
}
