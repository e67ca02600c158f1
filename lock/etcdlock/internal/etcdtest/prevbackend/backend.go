// Package prevbackend is the etcd lock's backend as it was before its
// keys shared a kept-alive lease per Locker and TTL: each grant stood on an
// etcd lease of its own (granted ahead of the try when the Locker was
// busy, revoked by the release). Nothing uses it but the benchmarks, which
// run it beside the current backend and etcd's concurrency package on the
// same cluster, so the change's effect can be measured again.
package prevbackend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// TokenBase is added to a holder key's create revision to make its token:
// 2^52, above every clock-anchored token of the Redis and PostgreSQL locks
// (microseconds since 1970 stay below 2^52 until the year 2112), so that a
// resource moved from either of them to etcd keeps being admitted by the
// guards, and below fence.MaxToken by 2^52 revisions.
const TokenBase fence.Token = 1 << 52

// cleanupBound bounds a revoke sent after its caller gave up, when no
// Settings.Background runs it.
const cleanupBound = 2 * time.Second

// Backend is the etcd lock: grants, extensions and releases on etcd leases,
// waiting in arrival order woken by a watch, and the record beside the lock.
type Backend struct {
	cli    *clientv3.Client
	prefix string
	poll   bool
	bg     func(ctx context.Context, f func(ctx context.Context))

	mu     sync.Mutex
	rooms  map[string]*room // resource -> waiters of this process
	leases map[string]leaseRef
	// spare leases, granted ahead of tries (lease.go), by TTL in seconds
	spares  map[int64]spare
	filling map[int64]bool
	lastTry map[int64]time.Time
	closed  bool
	wg      sync.WaitGroup
	stop    chan struct{}

	// BeforeTxn, when set (by tests), runs in Try between the lease's
	// grant and the transaction that puts the key on it.
	BeforeTxn func()
}

// leaseRef is the lease last attached to a holder's key by this process,
// with the key's modification revision then.
type leaseRef struct {
	id  clientv3.LeaseID
	mod int64
}

var (
	_ lockbackend.Backend  = (*Backend)(nil)
	_ lockbackend.Queue    = (*Backend)(nil)
	_ lockbackend.Recorder = (*Backend)(nil)
)

// New makes the etcd backend on cli from a Locker's settings. It refuses,
// with an error matching fence.ErrInvalid, the options that mean nothing on
// etcd: a retention (etcd keeps no token state to retain) and a node
// timeout (one cluster answers, by consensus).
func New(cli *clientv3.Client, s lockbackend.Settings) (*Backend, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: etcdlock: nil *clientv3.Client", fence.ErrInvalid)
	}
	if s.Given&lockbackend.GivenRetention != 0 {
		return nil, fmt.Errorf("%w: etcdlock: WithTokenRetention means nothing on etcd, which keeps no token state", lockbackend.ErrUnsupported)
	}
	if s.Given&lockbackend.GivenNodeTimeout != 0 {
		return nil, fmt.Errorf("%w: etcdlock: WithNodeTimeout means nothing on etcd, whose cluster answers as one", lockbackend.ErrUnsupported)
	}
	if strings.ContainsAny(s.Prefix, "{}") {
		return nil, fmt.Errorf("%w: etcdlock: prefix %q contains a brace", fence.ErrInvalid, s.Prefix)
	}
	b := &Backend{
		cli:    cli,
		prefix: s.Prefix,
		poll:   s.Poll,
		bg:     s.Background,
		rooms:  map[string]*room{},
		leases: map[string]leaseRef{},
		stop:   make(chan struct{}),

		spares:  map[int64]spare{},
		filling: map[int64]bool{},
		lastTry: map[int64]time.Time{},
	}
	return b, nil
}

// Info reports etcd's offer: one cluster, waiting in arrival order (unless
// the Locker polls), no owners' holds.
func (b *Backend) Info() lockbackend.Info {
	return lockbackend.Info{Name: "etcd", Quorum: 1, Queue: !b.poll}
}

// Prefix returns the prefix of the backend's keys.
func (b *Backend) Prefix() string { return b.prefix }

func (b *Backend) dir(resource string) string { return b.prefix + "{" + resource + "}" }
func (b *Backend) holders(resource string) string {
	return b.dir(resource) + "/h/"
}
func (b *Backend) holderKey(resource, holder string) string {
	return b.holders(resource) + holder
}
func (b *Backend) recordKey(resource string) string { return b.dir(resource) + "/r" }

// hold is a grant's record: its key, its token and the lease its key is
// attached to (which an extension past the lease's TTL replaces).
type hold struct {
	resource, holder, key string
	rev                   int64 // the key's create revision

	mu    sync.Mutex
	lease clientv3.LeaseID
	ttl   int64 // the lease's TTL, in seconds
}

func (h *hold) current() (clientv3.LeaseID, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease, h.ttl
}

// leaseSeconds is the etcd lease TTL that covers ttl: whole seconds,
// rounded up, so the server holds at least what the lock asked.
func leaseSeconds(ttl time.Duration) int64 {
	return max(1, int64(math.Ceil(ttl.Seconds())))
}

// drift is the allowance taken off what the client believes, as the
// Redlock does for clocks that run at different rates: the etcd leader's
// and the client's.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

func token(rev int64) (fence.Token, error) {
	if rev <= 0 || fence.Token(rev) > fence.MaxToken-TokenBase {
		return 0, lockbackend.ErrTokensExhausted
	}
	return TokenBase + fence.Token(rev), nil
}

// Try grants an etcd lease for req.TTL, then, in one transaction, puts the
// holder's key on it if the resource has no key (or, with req.Queue, puts
// it in any case, so it waits in create-revision order) and reads the
// first key. The grant is the holder's key being the first; the token is
// its create revision, from the transaction's own response.
func (b *Backend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	start := time.Now()
	secs := leaseSeconds(req.TTL)
	// A queueing try's lease is granted now, never taken from the spare:
	// a release may hand the lock to the entry it puts, and the Locker then
	// counts that lease from this try's send.
	newLease, sent, err := b.takeLease(ctx, secs, !req.Queue)
	if err != nil {
		// A lease granted whose reply was lost holds no key, and the
		// server expires it: nothing to undo.
		return lockbackend.Outcome{}, b.callErr(ctx, "Try", req.Resource, err)
	}
	lease := newLease
	key := b.holderKey(req.Resource, req.Holder)
	first := clientv3.OpGet(b.holders(req.Resource), clientv3.WithFirstCreate()...)
	mine := clientv3.OpGet(key)
	if b.BeforeTxn != nil {
		b.BeforeTxn()
	}
	var txn clientv3.Txn
	if req.Queue {
		txn = b.cli.Txn(ctx).Then(clientv3.OpPut(key, "", clientv3.WithLease(lease)), first, mine)
	} else {
		txn = b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Version(b.holders(req.Resource)).WithPrefix(), "=", 0)).
			Then(clientv3.OpPut(key, "", clientv3.WithLease(lease)), first, mine).
			Else(first, mine)
	}
	resp, err := txn.Commit()
	if err != nil {
		// The put may have run: revoking the lease removes the key it
		// put, so no lock is left that nobody knows about.
		b.revokeLater(ctx, lease)
		return lockbackend.Outcome{}, b.callErr(ctx, "Try", req.Resource, err)
	}
	firstKV := kvOf(resp.Responses[len(resp.Responses)-2])
	mineKV := kvOf(resp.Responses[len(resp.Responses)-1])
	if mineKV == nil || mineKV.Lease != int64(lease) {
		// Nothing of ours is on the new lease.
		b.giveBack(context.WithoutCancel(ctx), lease, sent, secs)
	}
	if mineKV != nil && mineKV.Lease != int64(lease) {
		// This holder's entry stands on an older lease (a grant or an
		// entry of an earlier try of the same acquisition).
		lease = clientv3.LeaseID(mineKV.Lease)
	}
	if firstKV == nil || mineKV == nil || string(firstKV.Key) != key {
		out := lockbackend.Outcome{Remaining: -1, Place: -1}
		if req.Queue && mineKV != nil {
			out.Ref = mineKV.ModRevision
			if old, ok := b.remember(key, lease, mineKV.ModRevision); ok && old != lease {
				// The entry moved to this try's lease: the one it stood on
				// holds nothing now.
				b.revokeLater(context.WithoutCancel(ctx), old)
			}
		}
		return out, nil
	}
	tok, err := token(mineKV.CreateRevision)
	if err != nil {
		b.revokeLater(context.WithoutCancel(ctx), lease)
		return lockbackend.Outcome{}, fmt.Errorf("etcdlock: Try %q: %w", req.Resource, err)
	}
	if old, ok := b.leaseOf(key); ok && old.id != lease {
		b.revokeLater(context.WithoutCancel(ctx), old.id)
	}
	b.forget(key)
	h := &hold{resource: req.Resource, holder: req.Holder, key: key, rev: mineKV.CreateRevision, lease: lease, ttl: secs}
	out := lockbackend.Outcome{Granted: true, Hold: h, Token: tok, Holder: req.Holder,
		Known:      min(req.TTL, sent.Add(time.Duration(secs)*time.Second).Sub(start)) - drift(req.TTL),
		HandedOver: mineKV.CreateRevision != resp.Header.Revision}
	if mineKV.Lease != int64(newLease) {
		// A grant made on an older lease (handed over while queued, or
		// the run this try repeats): what the server says is left of it.
		ttl, err := b.cli.TimeToLive(ctx, lease)
		if err != nil || ttl.TTL <= 0 {
			b.revokeLater(context.WithoutCancel(ctx), lease)
			if err == nil {
				return lockbackend.Outcome{}, fmt.Errorf("etcdlock: Try %q: %w", req.Resource, lockbackend.ErrNotHeld)
			}
			return lockbackend.Outcome{}, b.callErr(ctx, "Try", req.Resource, err)
		}
		h.ttl = ttl.GrantedTTL
		known := time.Duration(ttl.TTL)*time.Second - drift(time.Duration(ttl.GrantedTTL)*time.Second)
		out.Known = max(0, min(out.Known, known))
	}
	return out, nil
}

func kvOf(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	rr := r.GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return nil
	}
	return rr.Kvs[0]
}

// Extend keeps h's lease alive: a keep-alive restarts the lease's TTL,
// which covers ttl when the lease was granted for at least ttl; otherwise
// the key moves to a new lease of ttl, in a transaction that checks it is
// still h's.
func (b *Backend) Extend(ctx context.Context, hh lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	h := hh.(*hold)
	lease, secs := h.current()
	if secs >= leaseSeconds(ttl) {
		resp, err := b.cli.KeepAliveOnce(ctx, lease)
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return 0, fmt.Errorf("etcdlock: Extend %q: %w", h.resource, lockbackend.ErrNotHeld)
			}
			return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", h.resource, err))
		}
		d := time.Duration(resp.TTL) * time.Second
		return d - drift(d), nil
	}
	secs = leaseSeconds(ttl)
	lg, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", h.resource, err))
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev),
			clientv3.Compare(clientv3.LeaseValue(h.key), "=", lease)).
		Then(clientv3.OpPut(h.key, "", clientv3.WithLease(lg.ID))).
		Commit()
	if err != nil {
		// The key may have moved to the new lease: keep both alive is
		// not possible, so say the outcome is unknown; the old lease
		// still expires on its own.
		return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", h.resource, err))
	}
	if !resp.Succeeded {
		b.revokeLater(context.WithoutCancel(ctx), lg.ID)
		return 0, fmt.Errorf("etcdlock: Extend %q: %w", h.resource, lockbackend.ErrNotHeld)
	}
	h.mu.Lock()
	h.lease, h.ttl = lg.ID, secs
	h.mu.Unlock()
	b.revokeLater(context.WithoutCancel(ctx), lease)
	d := time.Duration(secs) * time.Second
	return d - drift(d), nil
}

// Release revokes h's lease, which deletes its key in the same step: the
// next key in create-revision order, the first waiter, then holds the lock.
func (b *Backend) Release(ctx context.Context, hh lockbackend.Hold) error {
	h := hh.(*hold)
	lease, _ := h.current()
	_, err := b.cli.Revoke(ctx, lease)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("etcdlock: Release %q: %w", h.resource, lockbackend.ErrNotHeld)
	default:
		return fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Release", h.resource, err))
	}
}

// TTL returns what the server says is left of h's lease, in whole seconds
// rounded down.
func (b *Backend) TTL(ctx context.Context, hh lockbackend.Hold) (time.Duration, error) {
	h := hh.(*hold)
	lease, _ := h.current()
	resp, err := b.cli.TimeToLive(ctx, lease)
	if err != nil {
		return 0, b.callErr(ctx, "TTL", h.resource, err)
	}
	if resp.TTL <= 0 {
		return 0, fmt.Errorf("etcdlock: TTL %q: %w", h.resource, lockbackend.ErrNotHeld)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Abandon deletes holder's key, whether it holds the lock (handed over
// while the waiter gave up) or waits in the queue; the next key then holds
// the lock. Deleting a key that is gone changes nothing.
func (b *Backend) Abandon(ctx context.Context, resource, holder, acq string) error {
	key := b.holderKey(resource, holder)
	_, err := b.cli.Delete(ctx, key)
	b.forget(key)
	if err != nil {
		return b.callErr(ctx, "Abandon", resource, err)
	}
	return nil
}

// Close stops the watches of waiting acquisitions and waits, until
// deadline at most, for the revokes it sent in the background.
func (b *Backend) Close(deadline time.Time) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.stop)
	rooms := b.rooms
	b.rooms = map[string]*room{}
	b.mu.Unlock()
	for _, r := range rooms {
		r.cancel()
	}
	b.revokeSpares(deadline)
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// revokeLater revokes lease after its caller's call, bounded: through the
// Locker's Background when it has one, else in a goroutine Close waits for.
func (b *Backend) revokeLater(ctx context.Context, lease clientv3.LeaseID) {
	revoke := func(ctx context.Context) { _, _ = b.cli.Revoke(ctx, lease) }
	if b.bg != nil {
		b.bg(ctx, revoke)
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		defer cancel()
		revoke(ctx)
	}()
}

// remember notes the lease a queued holder's entry stands on, and returns
// the one it stood on before.
func (b *Backend) remember(key string, lease clientv3.LeaseID, mod int64) (clientv3.LeaseID, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.leases[key]
	b.leases[key] = leaseRef{lease, mod}
	return old.id, ok
}

// leaseOf returns the lease this process last put key on.
func (b *Backend) leaseOf(key string) (leaseRef, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.leases[key]
	return r, ok
}

func (b *Backend) forget(key string) {
	b.mu.Lock()
	delete(b.leases, key)
	b.mu.Unlock()
}

// callErr names the call and matches ctx.Err() when ctx ended.
func (b *Backend) callErr(ctx context.Context, call, resource string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("etcdlock: %s %q: %w (%w)", call, resource, ctx.Err(), err)
	}
	return fmt.Errorf("etcdlock: %s %q: %w", call, resource, err)
}

// formatRecord writes a record's value after its token, zero-padded to 16
// digits, so that etcd's byte-wise comparison of values orders records by
// token.
func formatRecord(tok fence.Token, value string) string {
	return fmt.Sprintf("%016d\n%s", int64(tok), value)
}

func parseRecord(v []byte) (lockbackend.Record, bool) {
	s := string(v)
	if len(s) < 17 || s[16] != '\n' {
		return lockbackend.Record{}, false
	}
	n, err := strconv.ParseInt(s[:16], 10, 64)
	if err != nil {
		return lockbackend.Record{}, false
	}
	return lockbackend.Record{Token: fence.Token(n), Value: s[17:]}, true
}
