package lock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

// Redlock: one lease held on a quorum of independent Redis masters.
//
// Every node runs the same scripts as a single Redis deployment does
// (acquire.lua, release.lua, extend.lua, ttl.lua), so each node that grants
// also issues its own clock-anchored token; the lease's token is the largest
// of them, and redlock_raise.lua then lifts the granting nodes' token state
// to it. Every call to the nodes goes out in parallel and is bounded by the
// node timeout, whatever the client's own timeouts are: a node that has not
// answered by then counts as failed and the call goes on without it.

//go:embed redlock_raise.lua
var redlockRaiseLua string

var redlockRaiseScript = redis.NewScript(tokenStateLua + redlockRaiseLua)

// DefaultNodeTimeout is how long a Redlock [Locker] waits for each node when
// no [WithNodeTimeout] option is given.
const DefaultNodeTimeout = 50 * time.Millisecond

// ErrNoQuorum means a Redlock call reached fewer nodes than its quorum
// needs: too many nodes were down, unreachable or slower than the node
// timeout, or (for an acquisition) took so long that no validity was left
// or could not raise a quorum's token state to the lease's token.
// Errors that match it are a [*QuorumError]; when some node had the lock
// granted to another holder, the error also matches [ErrNotAcquired], and
// [Locker.Acquire] keeps trying.
var ErrNoQuorum = errors.New("lock: no quorum of Redlock nodes")

// WithNodeTimeout sets how long a Locker made by [NewRedlock] waits for each
// node's reply to one call. default: [DefaultNodeTimeout].
//
// Keep it far below the leases you take: an acquisition's validity is its
// TTL less the time it took, so a node timeout near the TTL lets one slow
// node make every acquisition fail. d must be between 1ms and [MaxTTL].
// [New] refuses this option: a single deployment has no node to give up on.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > MaxTTL {
			return fmt.Errorf("%w: node timeout %v is outside [1ms, %v]", errInvalid, d, MaxTTL)
		}
		c.perNode = d
		c.given |= lockbackend.GivenNodeTimeout
		return nil
	}
}

// redlock is the backend of a Locker made by NewRedlock: its node set.
type redlock struct {
	nodes       []redlockNode
	quorum      int
	timeout     time.Duration
	prefix      string
	retentionMS int64
	background  func(ctx context.Context, f func(ctx context.Context))

	mu     sync.Mutex // orders calls.Add against close
	closed bool
	calls  sync.WaitGroup // fanOut's goroutines, until close
}

// track counts n calls about to start, so that close waits for them; it
// reports false (nothing counted) once close has begun.
func (r *redlock) track(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.calls.Add(n)
	return true
}

// Close waits for every call to a node that started before it, and for
// the calls to the nodes' clients that were cut short, until deadline.
func (r *redlock) Close(deadline time.Time) {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	waitUntil(&r.calls, deadline)
	for _, n := range r.nodes {
		n.calls.Wait(deadline)
	}
}

type redlockNode struct {
	client  redis.UniversalClient
	calls   *rediscall.Calls // the node's calls, ended by their context (see calls.go)
	publish string           // release.lua's ARGV[3]: "p", or "s" where releases publish with SPUBLISH
	dials   *dialWatch       // its latest failed dial, to explain a silence
}

// NewRedlock returns a Locker that holds each lease on a quorum of
// independent Redis masters, as the Redlock algorithm describes: the same
// [Locker] type, methods and [Lease] as [New] gives, so code switches by
// changing its constructor. clients are one client per master (each may
// itself be a cluster client); they must not share a server, or a node
// would vote twice. The quorum is len(clients)/2+1: 2 of 3, 3 of 5, and
// with an even count more than half (3 of 4), so two holders can never both
// have one.
//
// An acquisition sends acquire to every node in parallel, each bounded by
// the node timeout ([WithNodeTimeout]). It holds the lease only if a quorum
// granted it and time is left: validity = ttl − elapsed − drift, where
// drift = ttl/100 + 2ms allows for clocks running at different rates. The
// lease is then known held until that validity runs out (see
// [Lease.Validity]); [Lease.Done] closes then unless the lease is extended.
// A ttl under 3ms could never leave validity and is refused with
// [fence.ErrInvalid] before anything is sent. When the quorum fails, the attempt
// releases what it took on every node, not only those that answered, before
// returning a [*QuorumError]; it waits for those releases no longer than
// its context allows, and [Locker.Close] waits for the rest.
// [Locker.Acquire] retries after a random delay ([Backoff], or the
// [WithWait] strategy) while some node reports another holder, rather than
// waiting for release announcements, so contending clients do not retry in
// step and split the vote; it stops at once when too many nodes failed.
//
// Release and Extend go to every node. Extend keeps the lease only when a
// quorum extended it with validity left; a lease that a quorum no longer
// holds is lost ([ErrNotHeld], and Done closes). An extension never
// shortens a node's lock, so a failed Extend leaves [Lease.Validity] as it
// was, and a successful one counts what a quorum holds. [Lease.TTL] reports the
// time for which a quorum still holds the lock. [Locker.Advance] raises
// the token state on every node and succeeds once a quorum has it.
// [Owner] and [Locker.FenceLock] are refused with [fence.ErrInvalid]: holds would
// be counted per node, so a re-entry could land on a different quorum than
// the grant, and a foreign lock is fenced on one of its servers with [New].
//
// NewRedlock adds a hook to each client (once per client, however many
// Lockers share it) that remembers the client's latest failed dial, so a
// node that did not answer is reported by its own connection error
// ("connect: connection refused") rather than by a timeout alone. The hook
// changes nothing the client does and stays with the client.
//
// # Tokens
//
// Every granting node issues its own token (its server clock in
// microseconds, or its previous token plus one), and the lease's token is
// the largest of them. The granting nodes' token state is then raised to
// that token, and the lease is handed out only once a quorum of nodes is
// known to hold token state at it (they issued it, or confirmed the raise),
// so a later grant, whose quorum shares at least one node with that one,
// gets a higher token while that state lives, and a client retry of a
// node's acquisition returns the lease's token. When too few raises are
// confirmed (a node timed out, or lost the grant), the attempt is released
// on every node and fails with a [*QuorumError] that [Locker.Acquire]
// retries, as it retries a quorum whose validity ran out.
//
// This token is not a consensus value. Nodes do not agree on it; a node that
// restarts empty, a lagging clock, or a grant whose quorum overlaps the last
// one only on a node that lost its state can issue a token lower than an
// earlier lease's. Redlock itself can also admit two holders at once, after
// a pause, a clock jump or a node restart. None of this loses an update,
// because safety never comes from the lock: storage admits a fenced read or
// write only if its token is not below the highest it has admitted, in the
// same atomic step as the operation (see package fence). A low token is
// refused as stale, which costs progress, never data.
//
// Each Redlock call costs one round trip per node, sent in parallel; an
// acquisition adds a second one to raise the token state on the nodes whose
// token was below the largest. Acquire polls; no subscription is opened.
func NewRedlock(clients []redis.UniversalClient, opts ...Option) (*Locker, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: Redlock needs at least one Redis client", errInvalid)
	}
	seen := make(map[any]int, len(clients))
	nodes := make([]redlockNode, len(clients))
	for i, c := range clients {
		if isNil(c) {
			return nil, fmt.Errorf("%w: Redlock client %d is nil", errInvalid, i)
		}
		for _, id := range nodeIDs(c) {
			if j, dup := seen[id]; dup {
				return nil, fmt.Errorf("%w: Redlock clients %d and %d reach the same server (%v): it would vote twice", errInvalid, j, i, id)
			}
			seen[id] = i
		}
		nodes[i].client = c
		nodes[i].calls = rediscall.New(c)
		nodes[i].dials = watchDials(c)
		nodes[i].publish = "p"
		if _, ok := c.(*redis.ClusterClient); ok {
			nodes[i].publish = "s"
		}
	}
	return open(opts, func(set lockbackend.Settings) (lockbackend.Backend, error) {
		timeout := set.NodeTimeout
		if timeout == 0 {
			timeout = DefaultNodeTimeout
		}
		return &redlock{nodes: nodes, quorum: len(nodes)/2 + 1, timeout: timeout,
			prefix: set.Prefix, retentionMS: set.Retention.Milliseconds(), background: set.Background}, nil
	})
}

func (r *redlock) Info() lockbackend.Info {
	return lockbackend.Info{Name: "Redlock", Quorum: r.quorum}
}

func (r *redlock) lockKey(resource string) string { return r.prefix + "{" + resource + "}:lock" }

func (r *redlock) tokenKey(resource string) string { return r.prefix + "{" + resource + "}:token" }

func (r *redlock) channel(resource string) string { return r.prefix + "{" + resource + "}:released" }

var _ interface {
	lockbackend.Backend
	lockbackend.Advancer
	redisNames
} = (*redlock)(nil)

// nodeIDs names what makes two clients the same voter: the client itself,
// and for a plain client its server address and database.
func nodeIDs(c redis.UniversalClient) []any {
	ids := []any{c}
	if cl, ok := c.(*redis.Client); ok {
		o := cl.Options()
		ids = append(ids, fmt.Sprintf("%s/%d", o.Addr, o.DB))
	}
	return ids
}

// drift is Redlock's allowance for clocks running at different rates.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// checkRedlockTTL refuses a lease that would leave no validity once the
// drift allowance is taken off, however fast the nodes answered: under 3ms,
// since nodes get whole milliseconds. Acquiring it could never succeed.
func checkRedlockTTL(ttl time.Duration) error {
	if sent := ttl.Truncate(time.Millisecond); sent-drift(sent) <= 0 {
		return fmt.Errorf("%w: a Redlock lease of %v leaves no validity after the drift allowance of %v", errInvalid, ttl, drift(sent))
	}
	return nil
}

// QuorumError is a Redlock call that fewer nodes than its quorum answered as
// asked. It matches [ErrNoQuorum], and also [ErrNotAcquired] when some node
// had the lock granted to another holder (then [Locker.Acquire] tries
// again).
type QuorumError struct {
	Op       string // "acquire", "release", "extend", "ttl" or "advance"
	Resource string
	Nodes    int // nodes asked
	Quorum   int // nodes needed
	OK       int // nodes that did as asked
	Held     int // nodes where another holder has the lock (acquire)
	// Unraised counts, for an acquisition that a quorum granted, the
	// granting nodes whose token state was not confirmed raised to the
	// lease's token (the raise failed, went unanswered, or found the grant
	// gone). The lease is refused when fewer than Quorum are left at it.
	Unraised int
	// Remaining is the shortest remaining lease among the other holder's
	// nodes, or negative when unknown.
	Remaining time.Duration
	// Elapsed is how long the call took.
	Elapsed time.Duration
	// Err joins the failures of the nodes that did not answer, or nil.
	Err error
}

// Error says how many nodes did what and why the rest did not.
func (e *QuorumError) Error() string {
	s := fmt.Sprintf("lock: %s %q: %d of %d Redlock nodes, %d needed", e.Op, e.Resource, e.OK, e.Nodes, e.Quorum)
	if e.Held > 0 {
		s += fmt.Sprintf("; %d held by another holder", e.Held)
	}
	switch {
	case e.OK >= e.Quorum && e.OK-e.Unraised < e.Quorum:
		s += fmt.Sprintf("; only %d hold token state at the lease's token", e.OK-e.Unraised)
	case e.OK >= e.Quorum:
		s += fmt.Sprintf("; no validity left after %v", e.Elapsed.Round(time.Microsecond))
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns [ErrNoQuorum], a [*NotAcquiredError] when another holder
// was seen or a quorum granted but the acquisition ran out of validity or
// could not raise a quorum's token state (all worth retrying), and the
// nodes' failures.
func (e *QuorumError) Unwrap() []error {
	errs := []error{ErrNoQuorum}
	if e.Op == "acquire" && (e.Held > 0 || e.OK >= e.Quorum) {
		errs = append(errs, &NotAcquiredError{Resource: e.Resource, Remaining: e.Remaining})
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// nodeReply is one node's answer to one call.
type nodeReply[T any] struct {
	v   T
	err error // nil, a reply or network error, or errNodeTimeout
}

var errNodeTimeout = errors.New("no reply within the node timeout")

// fanOut runs call on each of the nodes at idx (every node when idx is nil)
// in parallel and returns their replies, in node order, once all have
// answered, the node timeout has passed or ctx has ended; nodes without an
// answer by then have errNodeTimeout (or ctx's error). A call that answers
// after fanOut returned is handed to late, if not nil, from its goroutine.
func fanOut[T any](ctx context.Context, r *redlock, idx []int,
	call func(ctx context.Context, n redlockNode) (T, error), late func(node int, v T, err error)) []nodeReply[T] {
	if idx == nil {
		idx = make([]int, len(r.nodes))
		for i := range idx {
			idx[i] = i
		}
	}
	out := make([]nodeReply[T], len(r.nodes))
	var (
		mu      sync.Mutex
		done    bool
		pending = len(idx)
		all     = make(chan struct{})
	)
	tracked := r.track(len(idx))
	for _, i := range idx {
		out[i].err = errNodeTimeout
		go func() {
			if tracked {
				defer r.calls.Done()
			}
			nctx, cancel := context.WithTimeout(ctx, r.timeout)
			n := r.nodes[i]
			// A call the node's client does not end by nctx's deadline is
			// cut short then; its answer goes to late once it comes.
			var lateCall func(nodeReply[T])
			if late != nil {
				lateCall = func(rep nodeReply[T]) { late(i, rep.v, rep.err) }
			}
			rep, ok := rediscall.Run(nctx, n.calls, func(ctx context.Context) nodeReply[T] {
				v, err := call(ctx, n)
				return nodeReply[T]{v: v, err: err}
			}, lateCall)
			if !ok {
				rep.err = errNodeTimeout
				if err := ctx.Err(); err != nil {
					rep.err = &rediscall.CutError{Err: err}
				}
			}
			cancel()
			mu.Lock()
			if done {
				mu.Unlock()
				if late != nil && ok {
					late(i, rep.v, rep.err)
				}
				return
			}
			out[i] = rep
			if pending--; pending == 0 {
				close(all)
			}
			mu.Unlock()
		}()
	}
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	done = true
	res := slices.Clone(out)
	if ctx.Err() != nil {
		for _, i := range idx {
			if res[i].err == errNodeTimeout {
				res[i].err = ctx.Err()
			}
		}
	}
	for _, i := range idx {
		if res[i].err != nil {
			res[i].err = explainSilence(res[i].err, r.nodes[i].dials)
		}
	}
	return res
}

// redlockHold is one grant on a quorum of nodes.
type redlockHold struct {
	resource, key, holder string
}

// Try is one try of an acquisition on every node; the queue is not used
// (Acquire polls).
func (r *redlock) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	resource, ttl := req.Resource, req.TTL
	// A holder id of its own for every try, not the acquisition's: a node
	// that granted an earlier try (released since, for want of a quorum)
	// keeps that holder in its token state, and would answer a try under
	// the same id as a client's retry, with the earlier grant's token.
	holder := fence.NewHolder()
	if err := checkRedlockTTL(ttl); err != nil {
		return lockbackend.Outcome{}, fmt.Errorf("%w: acquire %q", err, resource)
	}
	lockKey, tokenKey := r.lockKey(resource), r.tokenKey(resource)
	keys := []string{lockKey, tokenKey}
	releaseNode := func(n redlockNode) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = callScript(rctx, n.calls, n.client, nil, releaseScript, []string{lockKey}, holder, "", n.publish).Err()
	}
	// releaseAll releases on every node, not only those that granted. It
	// waits no longer than ctx allows: a release still under way goes on in
	// the background, bounded by cleanupTimeout, and Close waits for it.
	releaseAll := func() {
		fanOut(ctx, r, nil, func(_ context.Context, n redlockNode) (struct{}, error) {
			releaseNode(n)
			return struct{}{}, nil
		}, nil)
	}

	sent := time.Now()
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) ([]int64, error) {
		res, err := acquireScript.Run(ctx, n.client, keys, holder, ttl.Milliseconds(), r.retentionMS, "").Int64Slice()
		if err == nil && (len(res) < 2 || len(res) > 3 || res[0] > 1) {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		return res, err
	}, func(node int, res []int64, err error) {
		// An answer after the attempt gave up on this node: a grant, or a
		// run whose reply was lost, is released here, since the attempt's
		// own release may have reached the node first.
		if (err == nil && res[0] == 1) || (err != nil && !isReply(err)) {
			releaseNode(r.nodes[node])
		}
	})
	elapsed := time.Since(sent)

	var (
		granted   []int
		token     int64
		held      int
		remaining = time.Duration(-1)
		errs      []error
		wrongType error
	)
	for i, rep := range replies {
		switch {
		case rep.err != nil:
			if e := translate(ctx, rep.err, "acquire", resource); errors.Is(e, errWrongType) || errors.Is(e, ErrTokensExhausted) {
				wrongType = e
			}
			errs = append(errs, fmt.Errorf("node %d: %w", i, rep.err))
		case rep.v[0] == 0:
			held++
			if rem := time.Duration(rep.v[1]) * time.Millisecond; rem >= 0 && (remaining < 0 || rem < remaining) {
				remaining = rem
			}
		case rep.v[1] < 1:
			errs = append(errs, fmt.Errorf("node %d: the token state was lost during the grant", i))
		default:
			granted = append(granted, i)
			token = max(token, rep.v[1])
		}
	}
	if ctx.Err() != nil {
		releaseAll()
		return lockbackend.Outcome{}, endedFailure(ctx, "acquire", resource, errs)
	}
	validity := ttl - elapsed - drift(ttl)
	if len(granted) < r.quorum || validity <= 0 {
		releaseAll()
		if wrongType != nil && len(granted) < r.quorum {
			return lockbackend.Outcome{}, wrongType
		}
		return lockbackend.Outcome{}, &QuorumError{Op: "acquire", Resource: resource, Nodes: len(r.nodes), Quorum: r.quorum,
			OK: len(granted), Held: held, Remaining: remaining, Elapsed: elapsed, Err: joinNodes(errs)}
	}

	// Lift the granting nodes whose own token was lower to the lease's. The
	// lease is handed out only if a quorum then holds token state at its
	// token (issued there, or raised to it and still granted to this
	// holder): any later quorum shares a node with that one, and gets a
	// higher token from it while its state lives.
	var lower []int
	atToken := 0
	for _, i := range granted {
		if replies[i].v[1] < token {
			lower = append(lower, i)
		} else {
			atToken++
		}
	}
	if len(lower) > 0 {
		raised := fanOut(ctx, r, lower, func(ctx context.Context, n redlockNode) (int64, error) {
			return redlockRaiseScript.Run(ctx, n.client, []string{tokenKey, lockKey}, holder, token, r.retentionMS).Int64()
		}, nil)
		for _, i := range lower {
			switch rep := raised[i]; {
			case rep.err != nil:
				errs = append(errs, fmt.Errorf("node %d: raising its token state: %w", i, rep.err))
			case rep.v != 1:
				errs = append(errs, fmt.Errorf("node %d: the grant was gone before its token state was raised", i))
			default:
				atToken++
			}
		}
	}
	if ctx.Err() != nil || atToken < r.quorum || time.Since(sent) >= ttl-drift(ttl) {
		releaseAll()
		if err := ctx.Err(); err != nil {
			return lockbackend.Outcome{}, translate(ctx, err, "acquire", resource)
		}
		return lockbackend.Outcome{}, &QuorumError{Op: "acquire", Resource: resource, Nodes: len(r.nodes), Quorum: r.quorum,
			OK: len(granted), Held: held, Unraised: len(granted) - atToken, Remaining: remaining,
			Elapsed: time.Since(sent), Err: joinNodes(errs)}
	}
	if redlockTrace != nil {
		redlockTrace(holder, "grant", sent, ttl, fmt.Sprint(replies, " granted ", granted), ttl-drift(ttl))
	}
	return lockbackend.Outcome{Granted: true, Hold: &redlockHold{resource: resource, key: lockKey, holder: holder},
		Token: fence.Token(token), Holder: holder, Known: ttl - drift(ttl)}, nil
}

// Abandon releases holder's grant on every node (Redlock queues nobody).
func (r *redlock) Abandon(ctx context.Context, resource, holder, _ string) error {
	lockKey := r.lockKey(resource)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return releaseScript.Run(ctx, n.client, []string{lockKey}, holder, "", n.publish).Int64()
	}, nil)
	for _, rep := range replies {
		if rep.err != nil && !isReply(rep.err) {
			return lockbackend.ReplyLost(rep.err)
		}
	}
	return nil
}

// Release is Release on every node; it succeeds once a quorum released.
func (r *redlock) Release(ctx context.Context, hold lockbackend.Hold) error {
	h := hold.(*redlockHold)
	start := time.Now()
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return releaseScript.Run(ctx, n.client, []string{h.key}, h.holder, "", n.publish).Int64()
	}, nil)
	ok, notHeld, errs := count(replies, func(n int64) bool { return n == 1 })
	switch {
	case ok >= r.quorum:
		return nil
	case notHeld > len(replies)-r.quorum:
		// Too few nodes still held it for the lease to have been held.
		return ErrNotHeld
	}
	err := quorumFailure(ctx, &QuorumError{Op: "release", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: time.Since(start), Err: errs})
	if ctx.Err() != nil {
		return lockbackend.ReplyLost(err)
	}
	return err
}

// redlockTrace, when set (by tests), hears of every Redlock grant and
// extension: what the nodes replied and the validity counted from sent.
var redlockTrace func(holder, op string, sent time.Time, ttl time.Duration, replies string, valid time.Duration)

// Extend extends on every node, and counts what a quorum holds.
func (r *redlock) Extend(ctx context.Context, hold lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	h := hold.(*redlockHold)
	if err := checkRedlockTTL(ttl); err != nil {
		return 0, fmt.Errorf("%w: extend %q", err, h.resource)
	}
	sent := time.Now()
	keys := []string{h.key, r.tokenKey(h.resource)}
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return extendScript.Run(ctx, n.client, keys, h.holder, ttl.Milliseconds(), r.retentionMS).Int64()
	}, nil)
	elapsed := time.Since(sent)
	ok, notHeld, errs := count(replies, func(ms int64) bool { return ms != -3 })
	if ok >= r.quorum {
		// Each node that replied holds the lock for what it said from a
		// moment after sent; the quorum-th longest is how long a quorum
		// holds it. Extensions never shorten a node's lock, so neither do
		// the calls still in flight to the others.
		var left []int64
		for _, rep := range replies {
			if rep.err == nil && rep.v != -3 {
				left = append(left, max(rep.v, ttl.Milliseconds()))
			}
		}
		slices.Sort(left)
		slices.Reverse(left)
		held := time.Duration(left[r.quorum-1]) * time.Millisecond
		if valid := held - drift(held); elapsed < valid {
			if redlockTrace != nil {
				redlockTrace(h.holder, "extend", sent, ttl, fmt.Sprint(replies), valid)
			}
			return valid, nil
		}
	}
	if redlockTrace != nil {
		redlockTrace(h.holder, "extend failed", sent, ttl, fmt.Sprint(replies), 0)
	}
	if notHeld > len(replies)-r.quorum {
		return 0, errQuorumLost
	}
	// Nodes that answered late, or not at all, may have lengthened the
	// lock; none shortened it, so the lease keeps the expiry it knew.
	return 0, quorumFailure(ctx, &QuorumError{Op: "extend", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: elapsed, Err: errs})
}

// errQuorumLost is Extend's and TTL's error when a quorum of nodes no
// longer holds the grant.
var errQuorumLost = fmt.Errorf("%w: a quorum of Redlock nodes no longer holds it", ErrNotHeld)

// TTL is the time for which a quorum of nodes still holds the lock, less
// the drift allowance.
func (r *redlock) TTL(ctx context.Context, hold lockbackend.Hold) (time.Duration, error) {
	h := hold.(*redlockHold)
	start := time.Now()
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return ttlScript.Run(ctx, n.client, []string{h.key}, h.holder).Int64()
	}, nil)
	ok, notHeld, errs := count(replies, func(ms int64) bool { return ms != -3 })
	switch {
	case ok >= r.quorum:
		var left []int64
		for _, rep := range replies {
			if rep.err == nil && rep.v != -3 {
				left = append(left, rep.v)
			}
		}
		slices.Sort(left)
		slices.Reverse(left)
		// The quorum-th longest: the lock is held while that many nodes hold it.
		d := time.Duration(left[r.quorum-1])*time.Millisecond - drift(time.Duration(left[0])*time.Millisecond)
		return max(d, 0), nil
	case notHeld > len(replies)-r.quorum:
		return 0, errQuorumLost
	}
	return 0, quorumFailure(ctx, &QuorumError{Op: "ttl", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: time.Since(start), Err: errs})
}

// Advance raises the token state on every node: it succeeds once a quorum
// has the raised state, since every later grant's quorum includes one of
// those nodes.
func (r *redlock) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	start := time.Now()
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (struct{}, error) {
		return struct{}{}, advanceScript.Run(ctx, n.client, []string{r.tokenKey(resource)}, int64(atLeast), r.retentionMS).Err()
	}, nil)
	ok, _, errs := count(replies, func(struct{}) bool { return true })
	if ok >= r.quorum {
		return nil
	}
	for _, rep := range replies {
		if e := translate(ctx, rep.err, "advance", resource); errors.Is(e, errWrongType) {
			return e
		}
	}
	return quorumFailure(ctx, &QuorumError{Op: "advance", Resource: resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: time.Since(start), Err: errs})
}

// count sorts replies into those that did as asked, those that answered
// otherwise, and the failures, joined.
func count[T any](replies []nodeReply[T], good func(T) bool) (ok, other int, errs error) {
	var all []error
	for i, rep := range replies {
		switch {
		case rep.err != nil:
			all = append(all, fmt.Errorf("node %d: %w", i, rep.err))
		case good(rep.v):
			ok++
		default:
			other++
		}
	}
	return ok, other, joinNodes(all)
}
