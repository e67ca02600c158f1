package lock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// redlockNodes is a set of private Redis servers for Redlock tests. The
// first proxied ones are reached through a TCP proxy each, so that a test
// can slow them down or black-hole them; direct clients see every server
// as it is.
type redlockNodes struct {
	srvs    []*testenv.RedisServer
	proxies []*testenv.Proxy // nil for a node reached directly
	clients []redis.UniversalClient
	direct  []*redis.Client
}

// startNodes starts n private Redis servers, the first proxied of them
// behind a proxy each. The Locker's clients neither retry a command nor a
// failed dial, so a stopped node fails at once, as a refused connection
// does, rather than after go-redis's dial retries.
func startNodes(t *testing.T, n, proxied int) *redlockNodes {
	t.Helper()
	ns := &redlockNodes{}
	for i := range n {
		srv := testenv.StartRedis(t)
		ns.srvs = append(ns.srvs, srv)
		ns.direct = append(ns.direct, srv.Client())
		addr := srv.Addr()
		var p *testenv.Proxy
		if i < proxied {
			p = testenv.StartProxy(t, srv.Addr())
			addr = p.Addr()
		}
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		ns.proxies = append(ns.proxies, p)
		ns.clients = append(ns.clients, c)
	}
	return ns
}

// testNodeTimeout is the node timeout of the tests' Redlock Lockers unless
// a test sets its own: far above what a node on a loaded machine takes to
// answer, so that only the faults a test makes count as timeouts.
const testNodeTimeout = 2 * time.Second

func newRedlock(t *testing.T, ns *redlockNodes, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.NewRedlock(ns.clients, append([]lock.Option{lock.WithNodeTimeout(testNodeTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// lockValues returns the lock key's value on every node whose server runs
// ("" where there is none), skipping the nodes in stopped.
func (ns *redlockNodes) lockValues(t *testing.T, l *lock.Locker, resource string, stopped ...int) map[int]string {
	t.Helper()
	out := map[int]string{}
	for i, c := range ns.direct {
		if contains(stopped, i) {
			continue
		}
		v, err := c.Get(context.Background(), keysOf(l).LockKey(resource)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: %v", i, err)
		}
		out[i] = v
	}
	return out
}

// acquireScript is the package's acquisition script, as each Redlock node
// runs it.
func acquireScript(t *testing.T) *redis.Script {
	t.Helper()
	return scriptOf(t, "tokenstate.lua", "acquire.lua")
}

// raiseScript is the script that raises a Redlock node's token state to
// the lease's token.
func raiseScript(t *testing.T) *redis.Script {
	t.Helper()
	return scriptOf(t, "tokenstate.lua", "redlock_raise.lua")
}

// scriptOf is the script made of the package's files names, in order.
func scriptOf(t *testing.T, names ...string) *redis.Script {
	t.Helper()
	var src []byte
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join("internal", "redisbackend", name))
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	return redis.NewScript(string(src))
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestRedlockFiveNodesTwoStopped: with two of five masters killed, the three
// left are a quorum. The lease holds on each of them, its token is the
// largest they issued and every one of them was raised to it, the next
// grant's token is higher, and a release clears all three.
func TestRedlockFiveNodesTwoStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 0)
	l := newRedlock(t, ns)
	if keysOf(l).Quorum() != 3 {
		t.Fatalf("quorum of 5 = %d, want 3", keysOf(l).Quorum())
	}
	stopped := []int{1, 3}
	for _, i := range stopped {
		ns.srvs[i].Kill()
	}
	var last fence.Token
	for range 20 {
		lease, err := l.TryAcquire(ctx, "orders", 5*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire with 3 of 5 nodes up: %v", err)
		}
		if lease.Fence().Token <= last {
			t.Fatalf("token %d after %d", lease.Fence().Token, last)
		}
		last = lease.Fence().Token
		for i, v := range ns.lockValues(t, l, "orders", stopped...) {
			if v != lease.Fence().Holder {
				t.Fatalf("node %d holds %q, want the lease's holder", i, v)
			}
			n, g, h := tokenState(t, ns.direct[i], l, "orders")
			if n != lease.Fence().Token || g != lease.Fence().Token || h != lease.Fence().Holder[:8] {
				t.Fatalf("node %d token state %d %d %q; want the lease's token %d on every granting node", i, n, g, h, lease.Fence().Token)
			}
			// What a client retry of this node's acquisition gets back.
			res, err := acquireScript(t).Run(ctx, ns.direct[i], []string{keysOf(l).LockKey("orders"), keysOf(l).TokenKey("orders")},
				lease.Fence().Holder, 5000, int64(lock.DefaultTokenRetention/time.Millisecond), "").Int64Slice()
			if err != nil || len(res) != 2 || res[0] != 1 || fence.Token(res[1]) != lease.Fence().Token {
				t.Fatalf("node %d: a retried acquisition returned %v, %v; want the lease's token %d", i, res, err, lease.Fence().Token)
			}
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i, v := range ns.lockValues(t, l, "orders", stopped...) {
			if v != "" {
				t.Fatalf("node %d still holds %q after the release", i, v)
			}
		}
	}
}

// TestRedlockThreeStoppedRefuses: with three of five masters killed no
// quorum can be had. TryAcquire and Acquire both refuse at once with
// ErrNoQuorum (no other holder was seen, so waiting would not help), and
// the two live nodes hold no lock afterwards.
func TestRedlockThreeStoppedRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 0)
	l := newRedlock(t, ns)
	stopped := []int{0, 2, 4}
	for _, i := range stopped {
		ns.srvs[i].Kill()
	}
	_, err := l.TryAcquire(ctx, "orders", 5*time.Second)
	var qe *lock.QuorumError
	if !errors.Is(err, lock.ErrNoQuorum) || !errors.As(err, &qe) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with 2 of 5 nodes: %v; want ErrNoQuorum and not ErrNotAcquired", err)
	}
	if qe.OK != 2 || qe.Quorum != 3 || qe.Nodes != 5 {
		t.Fatalf("quorum error %+v; want 2 of 5 granted, 3 needed", qe)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := l.Acquire(actx, "orders", 5*time.Second); !errors.Is(err, lock.ErrNoQuorum) || actx.Err() != nil {
		t.Fatalf("Acquire with 2 of 5 nodes: %v; want ErrNoQuorum at once", err)
	}
	for i, v := range ns.lockValues(t, l, "orders", stopped...) {
		if v != "" {
			t.Fatalf("live node %d holds %q after a failed quorum", i, v)
		}
	}
}

// TestRedlockFailedQuorumLeavesNoLock: two nodes down and another holder on
// a third leave two grants, one short of the quorum. The attempt reports
// ErrNotAcquired (worth waiting for), releases its two grants, and leaves
// the other holder's lock alone.
func TestRedlockFailedQuorumLeavesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 0)
	l := newRedlock(t, ns)
	stopped := []int{0, 1}
	for _, i := range stopped {
		ns.srvs[i].Kill()
	}
	if err := ns.direct[2].Set(ctx, keysOf(l).LockKey("orders"), "rival", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquire(ctx, "orders", 5*time.Second)
	var na *lock.NotAcquiredError
	if !errors.Is(err, lock.ErrNoQuorum) || !errors.As(err, &na) || na.Remaining <= 0 {
		t.Fatalf("TryAcquire one grant short: %v; want ErrNoQuorum and a NotAcquiredError with the rival's remaining lease", err)
	}
	for i, v := range ns.lockValues(t, l, "orders", stopped...) {
		if want := map[bool]string{true: "rival", false: ""}[i == 2]; v != want {
			t.Fatalf("node %d holds %q after the failed quorum; want %q", i, v, want)
		}
	}
}

// TestRedlockValidityShrinks: the lease's validity is its TTL less the time
// the acquisition took and the drift allowance. Three of five nodes sit
// behind 100ms of latency each way, so a quorum takes at least 200ms, and
// the lease starts with that much less. When the acquisition takes longer
// than the TTL, no validity is left and it is refused and released.
func TestRedlockValidityShrinks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 3)
	l := newRedlock(t, ns, lock.WithNodeTimeout(2*time.Second))
	const ttl = 3 * time.Second
	drift := ttl/100 + 2*time.Millisecond

	before := time.Now()
	fast, err := l.TryAcquire(ctx, "fast", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if v, took := fast.Validity(), time.Since(before); v > ttl-drift || v < ttl-drift-took {
		t.Fatalf("validity of a fast acquisition %v; want just under %v, less at most the %v it took", v, ttl-drift, took)
	}

	const latency = 100 * time.Millisecond
	for _, p := range ns.proxies[:3] {
		p.SetLatency(latency)
	}
	before = time.Now()
	slow, err := l.TryAcquire(ctx, "slow", ttl)
	if err != nil {
		t.Fatal(err)
	}
	v := slow.Validity()
	took := time.Since(before)
	if v > ttl-drift-2*latency {
		t.Fatalf("validity %v after an acquisition through %v of latency each way; want at most %v", v, latency, ttl-drift-2*latency)
	}
	if v < ttl-drift-took {
		t.Fatalf("validity %v; want at least ttl - drift - %v (the time the call took)", v, took)
	}

	// A lease shorter than the acquisition: granted by a quorum, but
	// already run out, so refused, and released on every node.
	_, err = l.TryAcquire(ctx, "too-slow", 150*time.Millisecond)
	var qe *lock.QuorumError
	if !errors.As(err, &qe) || qe.OK < 3 || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("acquisition slower than its TTL: %v; want a quorum error with the grants but no validity", err)
	}
	for i, v := range ns.lockValues(t, l, "too-slow") {
		if v != "" {
			t.Fatalf("node %d holds %q after the refused acquisition", i, v)
		}
	}
}

// TestRedlockFailedQuorumReturnsWithinNodeTimeout: three of five nodes are
// black-holed (their connections stay open and carry nothing), so their
// replies never come. The attempt gives up on them after the node timeout,
// whatever the clients' own read timeouts (3s here), and returns within a
// small multiple of it: one timeout for the acquisition, one for the
// release it sends to every node. The two live nodes hold no lock once
// that release is through.
func TestRedlockFailedQuorumReturnsWithinNodeTimeout(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 3)
	const nodeTimeout = 200 * time.Millisecond
	l := newRedlock(t, ns, lock.WithNodeTimeout(nodeTimeout))
	// Warm every connection so the black hole catches commands, not dials;
	// with a Locker of its own, which waits for a loaded machine's first
	// scripts.
	lease, err := newRedlock(t, ns).TryAcquire(ctx, "orders", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range ns.proxies[:3] {
		p.Block()
	}
	start := time.Now()
	_, err = l.TryAcquire(ctx, "orders", 5*time.Second)
	took := time.Since(start)
	if !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("TryAcquire with 3 of 5 nodes black-holed: %v; want ErrNoQuorum", err)
	}
	// Under the clients' 3s read timeout, with room for a loaded machine.
	if took < nodeTimeout || took > 12*nodeTimeout {
		t.Fatalf("a failed quorum took %v; want between one and twelve node timeouts (%v)", took, nodeTimeout)
	}
	t.Logf("failed quorum returned after %v (node timeout %v)", took, nodeTimeout)
	deadline := time.Now().Add(5 * time.Second)
	for i := 3; i < 5; i++ {
		for ns.lockValues(t, l, "orders")[i] != "" {
			if time.Now().After(deadline) {
				t.Fatalf("live node %d still holds the lock 5s after the failed quorum", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestRedlockExtendAndLoss: Extend and TTL need a quorum. With one node
// down the lease extends; with three down Extend fails without declaring
// the lease lost (nodes did not answer); once the lease has run out on the
// live nodes Extend reports ErrNotHeld and Done closes.
func TestRedlockExtendAndLoss(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 0)
	l := newRedlock(t, ns)
	lease, err := l.TryAcquire(ctx, "orders", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ns.srvs[0].Kill()
	if err := lease.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend with 4 of 5 nodes: %v", err)
	}
	if d, err := lease.TTL(ctx); err != nil || d < 4*time.Second || d > 5*time.Second {
		t.Fatalf("TTL after Extend = %v, %v; want about 5s", d, err)
	}
	if v := lease.Validity(); v < 4*time.Second {
		t.Fatalf("validity after Extend %v; want about 5s", v)
	}
	ns.srvs[1].Kill()
	ns.srvs[2].Kill()
	if err := lease.Extend(ctx, 5*time.Second); !errors.Is(err, lock.ErrNoQuorum) || errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Extend with 2 of 5 nodes: %v; want ErrNoQuorum, not ErrNotHeld", err)
	}
	if lease.Err() != nil {
		t.Fatalf("the lease ended on unanswered nodes: %v", lease.Err())
	}

	ns3 := startNodes(t, 3, 0)
	l3 := newRedlock(t, ns3)
	short, err := l3.TryAcquire(ctx, "short", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for held := 3; held >= keysOf(l3).Quorum(); {
		held = 0
		for _, v := range ns3.lockValues(t, l3, "short") {
			if v != "" {
				held++
			}
		}
		if held >= keysOf(l3).Quorum() && time.Now().After(deadline) {
			t.Fatal("the 2s lease did not run out within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := short.Extend(ctx, time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Extend after the lease ran out on a quorum: %v; want ErrNotHeld", err)
	}
	if !closedWithin(short.Done(), time.Second) || !errors.Is(short.Err(), lock.ErrNotHeld) {
		t.Fatalf("Done not closed after a refused extension; Err = %v", short.Err())
	}
}

// TestRedlockAutoRenewAndDo: a renewed lease outlives its TTL while a
// quorum answers, and ends (Done closes) once a quorum is gone; Do runs
// with a Redlock Locker as with one Redis, and a waiting Acquire gets the
// lock once it is released.
func TestRedlockAutoRenewAndDo(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 3, 0)
	l := newRedlock(t, ns)
	// Long enough that a renewal delayed by a loaded machine still lands
	// within the lease; the test is about quorums, not timing.
	const ttl = 2 * time.Second
	lease, err := l.TryAcquire(ctx, "renewed", ttl, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	if closedWithin(lease.Done(), 2*ttl) {
		t.Fatalf("renewed lease ended: %v", lease.Err())
	}
	ns.srvs[0].Kill()
	ns.srvs[1].Kill()
	if !closedWithin(lease.Done(), 10*ttl) || !errors.Is(lease.Err(), lock.ErrNotHeld) {
		t.Fatalf("lease on 1 of 3 nodes not ended; Err = %v", lease.Err())
	}

	l2 := newRedlock(t, startNodes(t, 3, 0))
	holder, err := l2.TryAcquire(ctx, "job", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- l2.Do(ctx, "job", time.Second, func(ctx context.Context, f fence.Fence) error {
			if f.Token <= holder.Fence().Token {
				t.Errorf("Do's token %d not above the previous holder's %d", f.Token, holder.Fence().Token)
			}
			ran.Store(true)
			return nil
		})
	}()
	if ran.Load() {
		t.Fatal("Do ran while another lease held the lock")
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || !ran.Load() {
			t.Fatalf("Do after the release: %v (ran %v)", err, ran.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not get the lock within 10s of its release")
	}
}

// TestRedlockInput: bad node lists and options are refused before
// anything is sent, and calls a Redlock Locker does not offer say so.
func TestRedlockInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 2, 0)
	same := redis.NewClient(&redis.Options{Addr: ns.srvs[0].Addr()})
	t.Cleanup(func() { _ = same.Close() })
	var nilClient *redis.Client
	for _, tc := range []struct {
		name    string
		clients []redis.UniversalClient
		opts    []lock.Option
	}{
		{"no clients", nil, nil},
		{"nil interface", []redis.UniversalClient{ns.clients[0], nil}, nil},
		{"nil pointer", []redis.UniversalClient{ns.clients[0], nilClient}, nil},
		{"the same client twice", []redis.UniversalClient{ns.clients[0], ns.clients[1], ns.clients[0]}, nil},
		{"two clients of one server", []redis.UniversalClient{ns.clients[0], same}, nil},
		{"zero node timeout", ns.clients, []lock.Option{lock.WithNodeTimeout(0)}},
	} {
		if _, err := lock.NewRedlock(tc.clients, tc.opts...); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", tc.name, err)
		}
	}
	if _, err := lock.New(ns.clients[0], lock.WithNodeTimeout(time.Millisecond)); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New with WithNodeTimeout: %v; want ErrInvalid", err)
	}
	four := newRedlock(t, startNodes(t, 4, 0))
	if keysOf(four).Quorum() != 3 {
		t.Errorf("quorum of 4 = %d, want 3", keysOf(four).Quorum())
	}
	l := newRedlock(t, ns)
	if keysOf(l).Quorum() != 2 {
		t.Errorf("quorum of 2 = %d, want 2", keysOf(l).Quorum())
	}
	if _, err := l.TryAcquire(ctx, "r", time.Second, lock.Owner("job")); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Owner on Redlock: %v; want ErrInvalid", err)
	}
	if _, err := l.FenceLock(ctx, "k", "v"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("FenceLock on Redlock: %v; want ErrInvalid", err)
	}
	for i, v := range ns.lockValues(t, l, "r") {
		if v != "" {
			t.Errorf("node %d holds %q after refused calls", i, v)
		}
	}
}

// TestRedlockAdvance: Advance raises a quorum's token state, so the next
// grant's token is above the mark.
func TestRedlockAdvance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 3, 0)
	l := newRedlock(t, ns)
	lease, err := l.TryAcquire(ctx, "r", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mark := lease.Fence().Token + 1e12 // far ahead of every node's clock
	ns.srvs[2].Kill()
	if err := l.Advance(ctx, "r", mark); err != nil {
		t.Fatalf("Advance on 2 of 3 nodes: %v", err)
	}
	next, err := l.TryAcquire(ctx, "r", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence().Token <= mark {
		t.Fatalf("token %d after Advance to %d", next.Fence().Token, mark)
	}
}

// raiseHook is a go-redis hook on one Redlock node's client that acts on
// the script raising the node's token state to a lease's token. Armed with
// a proxy, it loses the raise in the network: it blocks the node's proxy
// before the script is written, and once the client has given up on the
// reply it cuts the proxy's connections (dropping the held bytes) and lets
// traffic through again. Armed to replay, it runs the script twice and
// reports the second reply, as a client retry after a lost reply does.
type raiseHook struct {
	sha, src string
	lose     atomic.Pointer[testenv.Proxy]
	replay   atomic.Bool
	seen     atomic.Int32 // raise scripts sent
}

func newRaiseHook(t *testing.T) *raiseHook {
	s := raiseScript(t)
	src, _ := os.ReadFile("internal/redisbackend/tokenstate.lua")
	raise, _ := os.ReadFile("internal/redisbackend/redlock_raise.lua")
	return &raiseHook{sha: s.Hash(), src: string(src) + string(raise)}
}

func (h *raiseHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *raiseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *raiseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 2 || (args[1] != h.sha && args[1] != h.src) {
			return next(ctx, cmd)
		}
		h.seen.Add(1)
		if p := h.lose.Load(); p != nil {
			p.Block()
			err := next(ctx, cmd)
			p.CutAll()
			p.Unblock()
			return err
		}
		if h.replay.CompareAndSwap(true, false) {
			_ = next(ctx, cmd) // the run whose reply is lost
		}
		return next(ctx, cmd)
	}
}

// aheadState writes resource's token state on node i a day ahead of the
// node's clock, as a node whose clock ran ahead leaves it, and returns that
// counter.
func (ns *redlockNodes) aheadState(t *testing.T, l *lock.Locker, i int, resource string) fence.Token {
	t.Helper()
	ctx := context.Background()
	now, err := ns.direct[i].Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := now.Add(24*time.Hour).UnixNano() / 1000
	if err := ns.direct[i].Set(ctx, keysOf(l).TokenKey(resource), strconv.FormatInt(n, 10), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return fence.Token(n)
}

// setLock sets resource's lock on the nodes at idx to holder for d, or
// deletes it when holder is "".
func (ns *redlockNodes) setLock(t *testing.T, l *lock.Locker, resource, holder string, d time.Duration, idx ...int) {
	t.Helper()
	for _, i := range idx {
		var err error
		if holder == "" {
			err = ns.direct[i].Del(context.Background(), keysOf(l).LockKey(resource)).Err()
		} else {
			err = ns.direct[i].Set(context.Background(), keysOf(l).LockKey(resource), holder, d).Err()
		}
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
}

// atToken counts the nodes whose token counter is at least token.
func (ns *redlockNodes) atToken(t *testing.T, l *lock.Locker, resource string, token fence.Token) int {
	t.Helper()
	k := 0
	for i, c := range ns.direct {
		v, err := c.Get(context.Background(), keysOf(l).TokenKey(resource)).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64); fence.Token(n) >= token {
			k++
		}
	}
	return k
}

// TestRedlockRaiseLostRefusesLease: node 0's token state runs a day ahead
// and nodes 3 and 4 hold a rival's lock, so a grant on nodes 0-2 takes
// node 0's token and must raise nodes 1 and 2 to it. When both raises are
// lost in the network (the clients time out), only node 0 holds state at that
// token, and a lease handed out with it would be followed by a lower token
// from the next grant, on nodes 2-4. The acquisition is refused instead, as
// a retryable failure that leaves no lock behind. Every lease that is
// handed out has a quorum of nodes at its token, and tokens never go back.
func TestRedlockRaiseLostRefusesLease(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 3)
	hooks := make([]*raiseHook, len(ns.clients))
	for i, c := range ns.clients {
		hooks[i] = newRaiseHook(t)
		c.AddHook(hooks[i])
	}
	// The raise is lost once the client gives up on it, well within the
	// node timeout, so that the release that follows finds the network
	// carrying traffic again.
	for _, i := range []int{1, 2} {
		ns.clients[i] = redis.NewClient(&redis.Options{Addr: ns.proxies[i].Addr(), MaxRetries: -1, ReadTimeout: 2 * time.Second})
		ns.clients[i].AddHook(hooks[i])
		t.Cleanup(func() { _ = ns.clients[i].Close() })
	}
	l := newRedlock(t, ns, lock.WithNodeTimeout(5*time.Second))
	const res = "orders"
	ns.aheadState(t, l, 0, res)
	var handed []*lock.Lease // the leases handed out, in order
	check := func(lease *lock.Lease) {
		t.Helper()
		for _, prev := range handed {
			if lease.Fence().Token <= prev.Fence().Token {
				t.Fatalf("lease token %d after an earlier lease's %d: the token went back", lease.Fence().Token, prev.Fence().Token)
			}
		}
		handed = append(handed, lease)
		if k := ns.atToken(t, l, res, lease.Fence().Token); k < keysOf(l).Quorum() {
			t.Errorf("lease token %d handed out with %d nodes holding token state at it; want a quorum (%d)", lease.Fence().Token, k, keysOf(l).Quorum())
		}
	}
	acquire := func(step string) *lock.Lease {
		t.Helper()
		lease, err := l.TryAcquire(ctx, res, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		check(lease)
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("%s: release: %v", step, err)
		}
		return lease
	}

	// A: granted on nodes 0-2 with node 0's token; raises lost on 1 and 2.
	ns.setLock(t, l, res, "rival", time.Minute, 3, 4)
	hooks[1].lose.Store(ns.proxies[1])
	hooks[2].lose.Store(ns.proxies[2])
	lease, err := l.TryAcquire(ctx, res, 10*time.Second)
	hooks[1].lose.Store(nil)
	hooks[2].lose.Store(nil)
	if hooks[1].seen.Load() != 1 || hooks[2].seen.Load() != 1 {
		t.Fatalf("raises sent to nodes 1 and 2: %d, %d; want one each", hooks[1].seen.Load(), hooks[2].seen.Load())
	}
	if err == nil {
		t.Errorf("a lease with token %d was handed out although its token state was raised on no node but node 0", lease.Fence().Token)
		check(lease)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	} else {
		var qe *lock.QuorumError
		var na *lock.NotAcquiredError
		if !errors.As(err, &qe) || !errors.Is(err, lock.ErrNoQuorum) || !errors.As(err, &na) {
			t.Fatalf("acquisition whose raises were lost: %v; want a QuorumError that Acquire retries (a NotAcquiredError)", err)
		}
		if qe.OK != 3 || qe.Unraised != 2 {
			t.Fatalf("quorum error %+v; want 3 grants, 2 of them not raised", qe)
		}
		t.Logf("refused: %v", err)
		// The releases may still be on their way (a loaded machine).
		deadline := time.Now().Add(5 * time.Second)
		for i := range 3 {
			for ns.lockValues(t, l, res)[i] != "" {
				if time.Now().After(deadline) {
					t.Fatalf("node %d holds the lock 5s after the refused acquisition", i)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}

	// C: the next grant, on nodes 2-4.
	ns.setLock(t, l, res, "", 0, 3, 4)
	ns.setLock(t, l, res, "rival", time.Minute, 0, 1)
	acquire("grant on nodes 2-4")

	// B: again on nodes 0-2, and this time the raises go through.
	ns.setLock(t, l, res, "", 0, 0, 1)
	ns.setLock(t, l, res, "rival", time.Minute, 3, 4)
	acquire("grant on nodes 0-2")

	// D: and on nodes 2-4 once more.
	ns.setLock(t, l, res, "", 0, 3, 4)
	ns.setLock(t, l, res, "rival", time.Minute, 0, 1)
	acquire("second grant on nodes 2-4")
}

// TestRedlockRaiseRetried: a client retry of a raise that already ran
// (its reply lost) reports the raise as done and changes nothing more: the
// lease is handed out with the leading node's token, and every granting
// node holds that token as its grant's, which a retried acquisition there
// returns.
func TestRedlockRaiseRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 3, 0)
	l := newRedlock(t, ns)
	const res = "orders"
	ahead := ns.aheadState(t, l, 0, res)
	for i := 1; i < 3; i++ {
		// Loaded, so that the replayed EVALSHA runs the script twice.
		if err := raiseScript(t).Load(ctx, ns.direct[i]).Err(); err != nil {
			t.Fatal(err)
		}
		h := newRaiseHook(t)
		h.replay.Store(true)
		ns.clients[i].AddHook(h)
		t.Cleanup(func() {
			if h.seen.Load() != 1 || h.replay.Load() {
				t.Errorf("node %d: %d raises, replayed %v; want one, replayed", i, h.seen.Load(), !h.replay.Load())
			}
		})
	}
	lease, err := l.TryAcquire(ctx, res, 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire with its raises retried: %v", err)
	}
	if lease.Fence().Token != ahead+1 {
		t.Fatalf("token %d; want node 0's next, %d", lease.Fence().Token, ahead+1)
	}
	for i := range ns.direct {
		n, g, h := tokenState(t, ns.direct[i], l, res)
		if n != lease.Fence().Token || g != lease.Fence().Token || h != lease.Fence().Holder[:8] {
			t.Fatalf("node %d token state %d %d %q; want the lease's token %d as its grant's", i, n, g, h, lease.Fence().Token)
		}
		got, err := acquireScript(t).Run(ctx, ns.direct[i], []string{keysOf(l).LockKey(res), keysOf(l).TokenKey(res)},
			lease.Fence().Holder, 10000, int64(lock.DefaultTokenRetention/time.Millisecond), "").Int64Slice()
		if err != nil || len(got) != 2 || got[0] != 1 || fence.Token(got[1]) != lease.Fence().Token {
			t.Fatalf("node %d: a retried acquisition returned %v, %v; want the lease's token %d", i, got, err, lease.Fence().Token)
		}
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockShortTTLRefused: a Redlock lease of under 3ms (sent in whole
// milliseconds) leaves no validity once the drift allowance (ttl/100 + 2ms)
// is taken off, so no acquisition could ever hold it. TryAcquire and
// Acquire refuse it at once with ErrInvalid, which also matches
// fence.ErrInvalid, and send nothing.
func TestRedlockShortTTLRefused(t *testing.T) {
	ctx := context.Background()
	ns := startNodes(t, 3, 0)
	var cmds testenv.Commands
	for _, c := range ns.clients {
		c.AddHook(&cmds)
	}
	l := newRedlock(t, ns)
	for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 2500 * time.Microsecond, 3*time.Millisecond - 1} {
		if _, err := l.TryAcquire(ctx, "r", ttl); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("TryAcquire(%v): %v; want ErrInvalid", ttl, err)
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := l.Acquire(actx, "r", ttl)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, fence.ErrInvalid) || took > time.Second {
			t.Errorf("Acquire(%v): %v after %v; want ErrInvalid at once", ttl, err, took)
		}
	}
	if sent := cmds.Take(); len(sent) > 0 {
		t.Errorf("refused acquisitions sent %d commands, starting with %v", len(sent), sent[:min(len(sent), 5)])
	}
	lease, err := l.TryAcquire(ctx, "r", 5*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire(5s): %v", err)
	}
	cmds.Take()
	if err := lease.Extend(ctx, 2*time.Millisecond); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Extend(2ms): %v; want ErrInvalid", err)
	}
	if sent := cmds.Take(); len(sent) > 0 {
		t.Errorf("a refused Extend sent %v", sent)
	}
	if v := lease.Validity(); v < time.Second {
		t.Errorf("validity %v after a refused Extend; want what the lease had", v)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockShortExtendKeepsTheLock: an Extend to a shorter TTL, even one
// whose round trips take longer than that TTL leaves validity for, keeps
// the time the lock had on every node, and the lease counts it.
func TestRedlockShortExtendKeepsTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 3, 3)
	l := newRedlock(t, ns)
	lease, err := l.TryAcquire(ctx, "orders", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	for _, p := range ns.proxies {
		p.SetLatency(150 * time.Millisecond)
	}
	const short = 200 * time.Millisecond
	err = lease.Extend(ctx, short)
	for _, p := range ns.proxies {
		p.SetLatency(0)
	}
	if err != nil {
		t.Fatalf("Extend(%v) of a lock with about 30s left: %v", short, err)
	}
	v := lease.Validity()
	if v < 20*time.Second {
		t.Errorf("validity %v after Extend(%v) of a lock with about 30s left", v, short)
	}
	for i, c := range ns.direct {
		pttl, err := c.PTTL(ctx, keysOf(l).LockKey("orders")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl+time.Millisecond < v {
			t.Errorf("node %d holds the lock for %v, the lease is told %v", i, pttl, v)
		}
	}
}

// TestRedlockCallsEndByDeadline: with three of five nodes black-holed and
// a node timeout far longer than the callers' contexts, an acquisition
// returns by its context's deadline; the release of what it took runs in
// the background, and Close waits for it, so once the network carries
// traffic again and Close has returned no node holds the lock, not even
// one whose grant arrived late.
func TestRedlockCallsEndByDeadline(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	ns := startNodes(t, 5, 3)
	l, err := lock.NewRedlock(ns.clients, lock.WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	warm, err := l.TryAcquire(ctx, "orders", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range ns.proxies[:3] {
		p.Block()
	}
	const budget = 300 * time.Millisecond
	// A loaded machine's scheduling; far below the 5s node timeout the
	// calls used to wait out.
	const margin = time.Second
	for _, try := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error { _, err := l.TryAcquire(ctx, "orders", 5*time.Second); return err }},
		{"Acquire", func(ctx context.Context) error { _, err := l.Acquire(ctx, "orders", 5*time.Second); return err }},
	} {
		dctx, cancel := context.WithTimeout(ctx, budget)
		start := time.Now()
		err := try.call(dctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with 3 of 5 nodes black-holed: %v; want the context's deadline", try.name, err)
		}
		if took > budget+margin {
			t.Errorf("%s returned %v after its context's %v deadline", try.name, took-budget, budget)
		}
		t.Logf("%s returned after %v (deadline %v)", try.name, took, budget)
	}
	for _, p := range ns.proxies[:3] {
		p.Unblock()
	}
	l.Close()
	for i, v := range ns.lockValues(t, l, "orders") {
		if v != "" {
			t.Errorf("node %d holds %q once Close returned", i, v)
		}
	}
}
