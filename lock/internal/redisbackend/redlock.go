package redisbackend

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

var redlockRaiseScript = newScript(tokenStateLua + redlockRaiseLua)

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
	lockbackend.WaitUntil(&r.calls, deadline)
	for _, n := range r.nodes {
		n.calls.Wait(deadline)
	}
}

type redlockNode struct {
	client  Client
	calls   *rediscall.Calls // the node's calls, ended by their context (see calls.go)
	publish string           // release.lua's ARGV[2]: "p", or "s" where releases publish with SPUBLISH
}

// NewRedlock validates clients (one per independent master, none nil,
// no two reaching the same server) and returns the constructor of their
// Redlock backend, for package lock's NewRedlock; a Locker that sets no
// node timeout gets defaultTimeout.
func NewRedlock(clients []redis.UniversalClient, defaultTimeout time.Duration) (func(lockbackend.Settings) (lockbackend.Backend, error), error) {
	cs := make([]Client, len(clients))
	for i, c := range clients {
		if !IsNil(c) { // a nil one is refused in its turn below
			g := goRedisOf(c)
			g.watch()
			cs[i] = g
		}
	}
	return NewRedlockOn(cs, defaultTimeout)
}

// NewRedlockOn is NewRedlock on clients of any client library, none nil.
func NewRedlockOn(clients []Client, defaultTimeout time.Duration) (func(lockbackend.Settings) (lockbackend.Backend, error), error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: Redlock needs at least one Redis client", errInvalid)
	}
	seen := make(map[any]int, len(clients))
	nodes := make([]redlockNode, len(clients))
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: Redlock client %d is nil", errInvalid, i)
		}
		for _, id := range c.IDs() {
			if j, dup := seen[id]; dup {
				return nil, fmt.Errorf("%w: Redlock clients %d and %d reach the same server (%v): it would vote twice", errInvalid, j, i, id)
			}
			seen[id] = i
		}
		nodes[i].client = c
		nodes[i].calls = rediscall.For(c.HonoursDeadlines())
		nodes[i].publish = "p"
		if c.Sharded() {
			nodes[i].publish = "s"
		}
	}
	return func(set lockbackend.Settings) (lockbackend.Backend, error) {
		timeout := set.NodeTimeout
		if timeout == 0 {
			timeout = defaultTimeout
		}
		return &redlock{nodes: nodes, quorum: len(nodes)/2 + 1, timeout: timeout,
			prefix: set.Prefix, retentionMS: set.Retention.Milliseconds(), background: set.Background}, nil
	}, nil
}

func (r *redlock) Info() lockbackend.Info {
	return lockbackend.Info{Name: "Redlock", Quorum: r.quorum}
}

func (r *redlock) LockKey(resource string) string { return r.prefix + "{" + resource + "}:lock" }

func (r *redlock) TokenKey(resource string) string { return r.prefix + "{" + resource + "}:token" }

func (r *redlock) Channel(resource string) string { return r.prefix + "{" + resource + "}:released" }

var _ interface {
	lockbackend.Backend
	lockbackend.Advancer
	names
} = (*redlock)(nil)

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

// QuorumFailure is a Redlock call that fewer nodes than its quorum
// answered as asked: the fields of lock.QuorumError, which package lock
// makes of it through QuorumError.
type QuorumFailure struct {
	Op, Resource                      string
	Nodes, Quorum, OK, Held, Unraised int
	Remaining, Elapsed                time.Duration
	Err                               error
}

// QuorumError turns a failure into the error the user sees (package lock
// sets it to build its *QuorumError, before any Locker exists), and
// ErrNoQuorum is what that error matches.
var (
	QuorumError func(QuorumFailure) error
	ErrNoQuorum error
)

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
			res[i].err = explainSilence(res[i].err, r.nodes[i].client)
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
	lockKey, tokenKey := r.LockKey(resource), r.TokenKey(resource)
	keys := []string{lockKey, tokenKey}
	releaseNode := func(n redlockNode) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = callScript(rctx, n.calls, n.client, nil, releaseScript, []string{lockKey}, holder, n.publish).Err()
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
		return lockbackend.Outcome{}, QuorumError(QuorumFailure{Op: "acquire", Resource: resource, Nodes: len(r.nodes), Quorum: r.quorum,
			OK: len(granted), Held: held, Remaining: remaining, Elapsed: elapsed, Err: joinNodes(errs)})
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
		return lockbackend.Outcome{}, QuorumError(QuorumFailure{Op: "acquire", Resource: resource, Nodes: len(r.nodes), Quorum: r.quorum,
			OK: len(granted), Held: held, Unraised: len(granted) - atToken, Remaining: remaining,
			Elapsed: time.Since(sent), Err: joinNodes(errs)})
	}
	if RedlockTrace != nil {
		RedlockTrace(holder, "grant", sent, ttl, fmt.Sprint(replies, " granted ", granted), ttl-drift(ttl))
	}
	return lockbackend.Outcome{Granted: true, Hold: &redlockHold{resource: resource, key: lockKey, holder: holder},
		Token: fence.Token(token), Holder: holder, Known: ttl - drift(ttl)}, nil
}

// Abandon releases holder's grant on every node (Redlock queues nobody).
func (r *redlock) Abandon(ctx context.Context, resource, holder, _ string) error {
	lockKey := r.LockKey(resource)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return releaseScript.Run(ctx, n.client, []string{lockKey}, holder, n.publish).Int64()
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
		return releaseScript.Run(ctx, n.client, []string{h.key}, h.holder, n.publish).Int64()
	}, nil)
	ok, notHeld, errs := count(replies, func(n int64) bool { return n == 1 })
	switch {
	case ok >= r.quorum:
		return nil
	case notHeld > len(replies)-r.quorum:
		// Too few nodes still held it for the lease to have been held.
		return ErrNotHeld
	}
	err := quorumFailure(ctx, &QuorumFailure{Op: "release", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: time.Since(start), Err: errs})
	if ctx.Err() != nil {
		return lockbackend.ReplyLost(err)
	}
	return err
}

// Extend extends on every node, and counts what a quorum holds.
func (r *redlock) Extend(ctx context.Context, hold lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	h := hold.(*redlockHold)
	if err := checkRedlockTTL(ttl); err != nil {
		return 0, fmt.Errorf("%w: extend %q", err, h.resource)
	}
	sent := time.Now()
	keys := []string{h.key, r.TokenKey(h.resource)}
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
			if RedlockTrace != nil {
				RedlockTrace(h.holder, "extend", sent, ttl, fmt.Sprint(replies), valid)
			}
			return valid, nil
		}
	}
	if RedlockTrace != nil {
		RedlockTrace(h.holder, "extend failed", sent, ttl, fmt.Sprint(replies), 0)
	}
	if notHeld > len(replies)-r.quorum {
		return 0, errQuorumLost
	}
	// Nodes that answered late, or not at all, may have lengthened the
	// lock; none shortened it, so the lease keeps the expiry it knew.
	return 0, quorumFailure(ctx, &QuorumFailure{Op: "extend", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
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
	return 0, quorumFailure(ctx, &QuorumFailure{Op: "ttl", Resource: h.resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Elapsed: time.Since(start), Err: errs})
}

// Advance raises the token state on every node: it succeeds once a quorum
// has the raised state, since every later grant's quorum includes one of
// those nodes.
func (r *redlock) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	start := time.Now()
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (struct{}, error) {
		return struct{}{}, advanceScript.Run(ctx, n.client, []string{r.TokenKey(resource)}, int64(atLeast), r.retentionMS).Err()
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
	return quorumFailure(ctx, &QuorumFailure{Op: "advance", Resource: resource, Nodes: len(replies), Quorum: r.quorum,
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
