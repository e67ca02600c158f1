// Package backend is the etcd lock: an implementation of the lock backend
// contract (internal/lockbackend) on go.etcd.io/etcd/client/v3. Package
// etcdlock is its constructor; the tests of the nested test module
// lock/etcdlock/internal/etcdtest drive it through the contract directly.
//
// One resource's state lives under one key directory, named with the
// resource in braces (which a resource may not contain, so no resource's
// range covers another's): the directory's "/h/" keys, one per holder and
// per queued waiter, and its "/r" key, the record beside the lock. A
// holder's key is named by a slot of the Backend that put it (the
// Backend's random id and a number) and holds the holder id: a slot goes
// back to the resource's free list once its key is gone, so that a
// resource locked again and again puts the same few keys, and etcd's index
// of the directory, which every grant walks, holds as many names as the
// process held keys at once rather than one per grant since the cluster
// last compacted. No key's name is made from a holder id: the backend
// finds its own keys through its entries (by resource and holder), a grant
// it keeps no entry of as the resource's first key (matched on the create
// revision and the holder id), an abandoned holder's keys by their value,
// and a waiter's hand-over by the first key's value. entry.go says why a
// slot's next key is safe from what was sent about its last.
//
// The lock belongs to the key of the directory with the lowest create
// revision, as with concurrency.Mutex: a release or an expiry deletes the
// holder's key, and the next key, the first waiter in arrival order, holds
// the lock in that same step. Keys stand on etcd leases that the backend
// shares per lease length and keeps alive while keys stand on them
// (session.go), so a try is one transaction and a release one deletion;
// each key also has an end of its own, at which the backend deletes it
// unless it was extended (entry.go). A paused or dead process keeps
// nothing alive, and the server expires its leases and their keys.
//
// The token is [TokenBase] plus the holder key's create revision: a
// consensus value that never goes back across leader changes and member
// restarts, and that increases with every grant of a resource, since the
// holders follow one another in create-revision order.
package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// cleanupBound bounds a deletion or a revoke sent after its caller gave
// up, when no Settings.Background runs it, and each one the backend sends
// on its own.
const cleanupBound = 2 * time.Second

// Backend is the etcd lock: grants, extensions and releases on etcd leases,
// waiting in arrival order woken by a watch, and the record beside the lock.
type Backend struct {
	cli    *clientv3.Client
	prefix string
	poll   bool
	bg     func(ctx context.Context, f func(ctx context.Context))

	id string // names this Backend's slots: unique to it

	mu       sync.Mutex
	rooms    map[string]*room     // resource -> waiters of this process
	sessions map[int64]*session   // by lease TTL in seconds
	entries  map[holderRef]*entry // what this process put, by acquisition
	slots    map[string]*slots    // resource -> its slot numbers
	busy     map[string]int       // slot key -> tries and releases of it in flight
	nextSlot int64                // the next slot number never used
	swept    time.Time            // when idle slots were last dropped
	closed   bool
	wg       sync.WaitGroup
	stop     chan struct{}
	frozen   atomic.Int32 // for tests: see Freeze

	// The highest revision and raft term seen in the cluster's answers
	// (see observe), and the highest revision seen before the cluster was
	// found to have gone back (0 when it never was): no grant at or below
	// it is believed.
	seenRev, seenTerm, wentBack atomic.Int64

	// BeforeTxn, when set (by tests), runs in Try between taking the
	// session's lease and the transaction that puts the key on it.
	BeforeTxn func()
	// SendTxn, when set (by tests), sends Try's and Abandon's
	// transactions in place of their Commit: a test makes a reply lost,
	// and a put or a deletion land late, with it.
	SendTxn func(ctx context.Context, txn clientv3.Txn) (*clientv3.TxnResponse, error)
	// SendDelete, when set (by tests), sends a release's deletion of its
	// slot's key in place of the client: a test holds it back, makes its
	// reply lost, and lands it late.
	SendDelete func(ctx context.Context, key string) (*clientv3.DeleteResponse, error)
	// KeepSlotOfLostRelease, when set (by tests), makes a broken variant:
	// the slot of a release whose reply was lost goes back to the free
	// list once the key's end has deleted the key, though the release's
	// deletion may still land on the slot's next key.
	KeepSlotOfLostRelease bool
	// OneSlot, when set (by tests, before the first Try), makes a broken
	// variant that the lock model must reject: every acquisition of a
	// resource takes one slot, whether or not a key stands on it, and a
	// try takes the key on its slot for its own whatever holder id it
	// holds.
	OneSlot bool
	// LateApply, when set (by tests, before the first Try), replaces
	// lateApply: how long the backend looks for the put of a try whose
	// reply was lost.
	LateApply time.Duration
	// IgnoreLoss, when set (by tests, before the first Try), makes a
	// broken variant that the lock model must reject: a grant's Lost
	// channel never closes, so that its Lease is believed to its end
	// though its lease was revoked or its key lost.
	IgnoreLoss bool
	// ReleaseFirstKey, when set (by tests, before the first Try), makes a
	// broken variant that the lock model must reject: a release deletes
	// the key that holds the lock when it is sent, without checking that
	// it is the grant's own (a late release frees another holder's lock).
	ReleaseFirstKey bool
	// RecordUnchecked, when set (by tests, before the first PutRecord),
	// makes a broken variant that the election model must reject: a record
	// is written whether or not its grant still holds the lock, on no
	// lease.
	RecordUnchecked bool
	// ResumeCompactedUnread, when set (by tests, before the first
	// WatchRecord), makes a broken variant that the election model must
	// reject: a record watch whose revision the cluster compacted resumes
	// from the compaction's revision without reading the record, so a
	// term written in between is never reported.
	ResumeCompactedUnread bool
	// BeforeEndDelete, when set (by tests, before the first Try), runs
	// when the backend has decided to delete a key whose end passed and
	// before it sends the deletion: a deletion that is slow to land.
	BeforeEndDelete func()
}

var (
	_ lockbackend.Backend  = (*Backend)(nil)
	_ lockbackend.Queue    = (*Backend)(nil)
	_ lockbackend.Recorder = (*Backend)(nil)
)

// ErrRevisionWentBack means the cluster answered with a revision (or a
// raft term) below one it had answered this Locker with before: it was
// restored from a backup without --bump-revision, or replaced by another
// cluster. Its revisions, and so its tokens, then repeat ones already
// issued, so the Locker grants no token at or below the highest revision
// it saw, and every lease it believed in before has ended. The operator's
// fix is to restore again with --bump-revision (see etcdlock's doc).
var ErrRevisionWentBack = errors.New("etcdlock: the cluster's revision went back below one it issued before (restored from a backup without --bump-revision?): no token at or below it is granted")

// errClosed refuses a try on a closed Locker, which keeps no lease alive.
var errClosed = fmt.Errorf("%w: etcdlock: the Locker is closed", fence.ErrInvalid)

// observe checks the header of a linearizable answer (a transaction, a
// read, a keep-alive) against the highest revision and raft term seen in
// answers received before its request was sent (sentRev, sentTerm; rev
// says the answer's revision counts: a keep-alive's comes from a leader
// that may not have applied every committed entry yet). Both only rise
// while the cluster lives; a restore from a backup without
// --bump-revision takes the revision back, and any restore starts the
// raft term again at 1. It reports false when the cluster went back, after
// ending every session: nothing believed before holds.
func (b *Backend) observe(sentRev, sentTerm int64, h *etcdserverpb.ResponseHeader, rev bool) bool {
	if h == nil {
		return true
	}
	term := int64(h.RaftTerm)
	if (rev && h.Revision < sentRev) || term < sentTerm {
		b.wentBackFrom(max(sentRev, b.seenRev.Load()), h)
		return false
	}
	if rev {
		atomicMax(&b.seenRev, h.Revision)
	}
	atomicMax(&b.seenTerm, term)
	return true
}

// seen returns what observe compares an answer with: call it before the
// request is sent.
func (b *Backend) seen() (rev, term int64) { return b.seenRev.Load(), b.seenTerm.Load() }

func atomicMax(v *atomic.Int64, n int64) {
	for {
		o := v.Load()
		if n <= o || v.CompareAndSwap(o, n) {
			return
		}
	}
}

// wentBackFrom ends every session after the cluster answered with h,
// below the revision from that it answered with before: every key this
// process believed in is of the cluster as it was, and grants at or below
// from are refused from now on. The leases are revoked, so that the keys
// of before that the restored cluster still holds go now.
func (b *Backend) wentBackFrom(from int64, h *etcdserverpb.ResponseHeader) {
	atomicMax(&b.wentBack, from)
	b.seenRev.Store(h.Revision)
	b.seenTerm.Store(int64(h.RaftTerm))
	b.mu.Lock()
	var ss []*session
	for _, s := range b.sessions {
		ss = append(ss, s)
	}
	closed := b.closed // Close took the sessions, and waits for nothing more
	b.mu.Unlock()
	for _, s := range ss {
		b.lost(s)
		if !closed {
			b.revokeLater(context.Background(), s.id)
		}
	}
}

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
		cli:      cli,
		prefix:   s.Prefix,
		poll:     s.Poll,
		bg:       s.Background,
		rooms:    map[string]*room{},
		sessions: map[int64]*session{},
		id:       fence.NewHolder(),
		entries:  map[holderRef]*entry{},
		slots:    map[string]*slots{},
		busy:     map[string]int{},
		stop:     make(chan struct{}),
	}
	return b, nil
}

// Info reports etcd's offer: one cluster, waiting in arrival order (unless
// the Locker polls), no owners' holds.
func (b *Backend) Info() lockbackend.Info {
	return lockbackend.Info{Name: "etcd", Quorum: 1, Queue: !b.poll}
}

// Tracked reports whether the backend keeps an entry of resource's
// acquisition holder (for tests: a lost try's stays until no put of it
// can land any more).
func (b *Backend) Tracked(resource, holder string) bool {
	return b.entryOf(resource, holder) != nil
}

// Prefix returns the prefix of the backend's keys.
func (b *Backend) Prefix() string { return b.prefix }

func (b *Backend) dir(resource string) string { return b.prefix + "{" + resource + "}" }
func (b *Backend) holders(resource string) string {
	return b.dir(resource) + "/h/"
}

// slotKey names slot n of this Backend under resource's directory.
func (b *Backend) slotKey(resource string, n int64) string {
	return b.holders(resource) + b.id + "." + strconv.FormatInt(n, 10)
}
func (b *Backend) recordKey(resource string) string { return b.dir(resource) + "/r" }

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

// Try puts the holder's key, on its slot, on the session lease of
// req.TTL's length, in one transaction that puts it only if the resource
// has no key (or, with req.Queue, in any case, so that it waits in
// create-revision order) and reads the first key. The grant is the
// holder's key being the first; the token is its create revision, from
// the transaction's own response.
func (b *Backend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	start := time.Now()
	secs := leaseSeconds(req.TTL)
	life := req.TTL
	if req.Queue {
		life = max(req.TTL, lockbackend.QueueLife)
	}
	var resp *clientv3.TxnResponse
	var s *session
	var e *entry
	// Two attempts after a lease that ended under the try, and one more
	// after a slot found holding a key this acquisition did not make.
	for range 3 {
		var err error
		if s, err = b.session(ctx, secs); err != nil {
			b.unused(e)
			return lockbackend.Outcome{}, b.callErr(ctx, "Try", req.Resource, err)
		}
		b.mu.Lock()
		if e == nil || e.gone {
			e = b.reserve(req.Resource, req.Holder, req.TTL)
		}
		if e.s != nil {
			// A refresh of a queued entry, or a try again of a grant: the
			// key's end must not come while this try runs.
			e.endAt(start.Add(life), true)
		}
		e.trying = true
		b.busy[e.key]++
		known := e.rev
		b.mu.Unlock()
		if b.BeforeTxn != nil {
			b.BeforeTxn()
		}
		holders := b.holders(req.Resource)
		// The put returns the key it replaced, so that a put landing on a
		// key this acquisition did not make is seen (see stale).
		put := clientv3.OpPut(e.key, req.Holder, clientv3.WithLease(s.id), clientv3.WithPrevKV())
		first := clientv3.OpGet(holders, clientv3.WithFirstCreate()...)
		mine := clientv3.OpGet(e.key)
		txn := b.cli.Txn(ctx)
		if req.Queue {
			txn = txn.Then(put, first, mine)
		} else {
			// On a free lock the put makes the only key, so the reply
			// needs no read: the key's revisions are the transaction's.
			txn = txn.If(clientv3.Compare(clientv3.Version(holders).WithPrefix(), "=", 0)).
				Then(put).
				Else(first, mine)
		}
		sentRev, sentTerm := b.seen()
		resp, err = b.commit(ctx, txn)
		if err == nil {
			b.observe(sentRev, sentTerm, resp.Header, true)
		}
		b.done(s)
		b.mu.Lock()
		e = b.tried(e)
		b.mu.Unlock()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The session's lease ended under it (the process was paused,
			// or cut off, past its TTL): nothing was put; a new lease.
			b.lost(s)
			continue
		}
		if err != nil {
			// The put may have run, or may still run: the key is deleted
			// now, and by its session's keep-alive ticks until a put of
			// this try can no longer land, so no lock is left that nobody
			// knows about. The slot is never used again: the put may land
			// after any deletion.
			b.mu.Lock()
			e.moveTo(s)
			late := lateApply
			if b.LateApply > 0 {
				late = b.LateApply
			}
			e.late = time.Now().Add(late)
			e.retired = true
			b.mu.Unlock()
			b.expireLater(ctx, e)
			return lockbackend.Outcome{}, b.callErr(ctx, "Try", req.Resource, err)
		}
		if kv, landed := b.stale(req, known, resp); kv != nil {
			// The slot holds a key of before: this acquisition goes on on
			// a fresh slot, whose name no key ever had.
			b.dropStale(ctx, e, s, kv, landed)
			e, resp = nil, nil
			continue
		}
		break
	}
	if resp == nil {
		b.unused(e)
		return lockbackend.Outcome{}, fmt.Errorf("etcdlock: Try %q: %w", req.Resource, rpctypes.ErrLeaseNotFound)
	}
	var firstKV, mineKV *mvccpb.KeyValue
	if !req.Queue && resp.Succeeded {
		rev := resp.Header.Revision
		mineKV = &mvccpb.KeyValue{Key: []byte(e.key), Value: []byte(req.Holder), CreateRevision: rev, ModRevision: rev, Version: 1, Lease: int64(s.id)}
		firstKV = mineKV
	} else {
		firstKV = kvOf(resp.Responses[len(resp.Responses)-2])
		mineKV = kvOf(resp.Responses[len(resp.Responses)-1])
	}
	if mineKV == nil {
		b.unused(e)
		return lockbackend.Outcome{Remaining: -1, Place: -1}, nil
	}
	if mineKV.Lease != int64(s.id) || (string(mineKV.Value) != req.Holder && !b.OneSlot) {
		// A grant an earlier try of this holder made on another lease that
		// this process no longer keeps: it is not this try's to report.
		// (A key of another holder's on the slot would be a broken
		// invariant: it is not reported either.)
		b.mu.Lock()
		if e.s == nil {
			e.retired = true
			b.untrackLocked(e)
		}
		b.mu.Unlock()
		return lockbackend.Outcome{}, fmt.Errorf("etcdlock: Try %q: the holder's key stands on a lease this Locker does not keep: %w", req.Resource, lockbackend.ErrNotHeld)
	}
	b.mu.Lock()
	e.moveTo(s)
	// This put is the key's now: a deletion decided for an earlier one
	// leaves it standing (it is conditional on that put).
	e.rev, e.mod, e.sent, e.ending = mineKV.CreateRevision, mineKV.ModRevision, start, false
	e.endAt(start.Add(life), true)
	guaranteed := s.guaranteed(start)
	b.mu.Unlock()
	if firstKV == nil || string(firstKV.Key) != e.key {
		out := lockbackend.Outcome{Remaining: -1, Place: -1}
		if req.Queue {
			out.Ref = mineKV.ModRevision
		}
		return out, nil
	}
	if req.Queue {
		// Granted: the key ends the TTL from this try, not the queue's.
		b.mu.Lock()
		e.endAt(start.Add(req.TTL), false)
		b.mu.Unlock()
	}
	tok, err := token(mineKV.CreateRevision)
	if err == nil && mineKV.CreateRevision <= b.wentBack.Load() {
		err = ErrRevisionWentBack
	}
	if err != nil {
		b.expireLater(ctx, e)
		return lockbackend.Outcome{}, fmt.Errorf("etcdlock: Try %q: %w", req.Resource, err)
	}
	return lockbackend.Outcome{Granted: true, Hold: e, Token: tok, Holder: req.Holder,
		Known:      max(0, min(req.TTL, guaranteed)-drift(req.TTL)),
		HandedOver: mineKV.CreateRevision != resp.Header.Revision}, nil
}

// stale reports the key that Try's reply resp found on its slot if this
// acquisition did not make it (nil otherwise), and whether the try's put
// landed on it: a key of another holder id, or of another create revision
// than the one the entry knew (known, 0 when it knew none). Such a key is
// one that came back when the cluster was restored from a backup taken
// before its deletion (with --bump-revision, so that no revision went
// back): it stands on a lease of this process, which keeps that lease
// alive for its other keys, and nobody believes in it. A put that lands on
// it keeps its create revision, a token issued before the backup, and its
// place in the queue; and with no put, it holds the lock for nobody.
func (b *Backend) stale(req *lockbackend.Request, known int64, resp *clientv3.TxnResponse) (*mvccpb.KeyValue, bool) {
	if b.OneSlot {
		return nil, false
	}
	other := func(kv *mvccpb.KeyValue) bool {
		return string(kv.Value) != req.Holder || (known != 0 && kv.CreateRevision != known)
	}
	if req.Queue {
		if pr := resp.Responses[0].GetResponsePut(); pr != nil && pr.PrevKv != nil && other(pr.PrevKv) {
			return kvOf(resp.Responses[len(resp.Responses)-1]), true
		}
		return nil, false
	}
	if resp.Succeeded {
		return nil, false // the put made the only key of the resource
	}
	if kv := kvOf(resp.Responses[len(resp.Responses)-1]); kv != nil && other(kv) {
		return kv, false
	}
	return nil, false
}

// dropStale deletes kv, the key stale found on e's slot (after the try's
// put when landed), if it is still as kv says, and retires the slot with
// every free slot of its resource, which may hold such keys too: the
// acquisition goes on with a new entry, on a slot never used. A deletion
// that fails is done by e's end, now, and its session's ticks when the
// try's put landed, else by a keep-alive tick's sweep of keys no
// acquisition owns (checkKeys), or by the key's lease's end.
func (b *Backend) dropStale(ctx context.Context, e *entry, s *session, kv *mvccpb.KeyValue, landed bool) {
	b.mu.Lock()
	e.retired = true
	if sl := b.slots[e.resource]; sl != nil {
		sl.free = nil
	}
	if ref := (holderRef{e.resource, e.holder}); b.entries[ref] == e {
		delete(b.entries, ref) // the acquisition's next entry is a new one
	}
	if landed && kv != nil {
		e.moveTo(s)
		e.rev, e.mod, e.ending = kv.CreateRevision, kv.ModRevision, false
	}
	b.mu.Unlock()
	var err error
	if kv != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		_, err = b.cli.Txn(dctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", kv.CreateRevision),
				clientv3.Compare(clientv3.ModRevision(e.key), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(e.key)).
			Commit()
		cancel()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil && landed && e.s != nil {
		e.endAt(time.Now(), false)
		return
	}
	b.untrackLocked(e)
}

// tried ends e's try, whose reply came or was lost: the entry to go on
// with. An entry that went while the try was in flight (its lease ended,
// or its end passed) kept its slot for the try, whose put may have landed
// or may still land: the slot passes to a new entry of the same holder.
// Backend.mu is held.
func (b *Backend) tried(e *entry) *entry {
	e.trying = false
	b.unbusyLocked(e.key)
	if !e.gone {
		return e
	}
	n := &entry{b: b, resource: e.resource, holder: e.holder, slot: e.slot, key: e.key, ttl: e.ttl, retired: e.retired}
	b.entries[holderRef{e.resource, e.holder}] = n
	sl := b.slots[e.resource]
	if sl == nil {
		sl = &slots{}
		b.slots[e.resource] = sl
	}
	sl.used++
	return n
}

// unused forgets e, an entry whose try put nothing, if no put of it
// stands: its slot goes back to the free list.
func (b *Backend) unused(e *entry) {
	if e == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.s == nil && !e.trying {
		b.untrackLocked(e)
	}
}

// expireLater deletes e's key now, within ctx while it lasts and then in
// the background, bounded; what that leaves undone, its session's
// keep-alive ticks do. The acquisition is over and nobody believes in the
// key, which a put whose reply was lost may have made again: whatever key
// of the holder stands is deleted.
func (b *Backend) expireLater(ctx context.Context, e *entry) {
	b.mu.Lock()
	e.forget()
	e.endAt(time.Now(), false)
	if e.timer != nil {
		e.timer.Stop()
	}
	closed := b.closed
	if !closed && b.bg == nil {
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if closed {
		return // nothing is kept alive after Close: the key ends with its lease
	}
	del := func(ctx context.Context) { b.expire(ctx, e) }
	if b.bg != nil {
		b.bg(ctx, del)
		return
	}
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		defer cancel()
		del(ctx)
	}()
}

// read is a linearizable read of key for a holder of a lease of secs
// seconds, each attempt bounded by a part of the TTL (see attempts). It
// returns an error matching ErrRevisionWentBack when the answer shows the
// cluster went back (see observe).
func (b *Backend) read(ctx context.Context, secs int64, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return attempts(ctx, time.Duration(secs)*time.Second, func(ctx context.Context) (*clientv3.GetResponse, error) {
		sentRev, sentTerm := b.seen()
		get, err := b.cli.Get(ctx, key, opts...)
		if err == nil && !b.observe(sentRev, sentTerm, get.Header, true) {
			return nil, ErrRevisionWentBack
		}
		return get, err
	})
}

// commit sends txn, through SendTxn when a test set it.
func (b *Backend) commit(ctx context.Context, txn clientv3.Txn) (*clientv3.TxnResponse, error) {
	if b.SendTxn != nil {
		return b.SendTxn(ctx, txn)
	}
	return txn.Commit()
}

func kvOf(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	rr := r.GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return nil
	}
	return rr.Kvs[0]
}

// Extend makes h's key live at least ttl from now: its end moves to ttl
// from now, and its lease is kept alive at once (or, for a ttl longer than
// the lease's, the key moves to a session of a longer lease, in a
// transaction that checks it is still h's). The validity it returns is
// what the keep-alive the server acknowledged guarantees, less the drift
// allowance.
func (b *Backend) Extend(ctx context.Context, hh lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	e := hh.(*entry)
	start := time.Now()
	b.mu.Lock()
	if e.gone || e.ending || !e.end.After(start) {
		// Its end passed: the key is being deleted, whatever a read
		// would still find.
		b.mu.Unlock()
		return 0, fmt.Errorf("etcdlock: Extend %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	e.endAt(start.Add(ttl), true)
	s, rev := e.s, e.rev
	b.mu.Unlock()
	notHeld := func() (time.Duration, error) {
		return 0, fmt.Errorf("etcdlock: Extend %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	if secs := leaseSeconds(ttl); s.secs < secs {
		ns, err := b.session(ctx, secs)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", e.resource, err))
		}
		defer b.done(ns)
		rkey := b.recordKey(e.resource)
		tok := fmt.Sprintf("%016d", int64(TokenBase+fence.Token(rev)))
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", rev),
				clientv3.Compare(clientv3.LeaseValue(e.key), "=", s.id)).
			Then(clientv3.OpPut(e.key, e.holder, clientv3.WithLease(ns.id)),
				// The record of this grant moves with it.
				clientv3.OpTxn([]clientv3.Cmp{
					clientv3.Compare(clientv3.Value(rkey), ">", tok),
					clientv3.Compare(clientv3.Value(rkey), "<", tok+"\v"),
				}, []clientv3.Op{clientv3.OpPut(rkey, "", clientv3.WithIgnoreValue(), clientv3.WithLease(ns.id))}, nil)).
			Commit()
		if err != nil {
			// The key may have moved: the old lease or the new one keeps
			// it, each until the key's end or its TTL, and its mod
			// revision is not known.
			b.mu.Lock()
			e.moveTo(ns)
			e.mod = 0
			b.mu.Unlock()
			return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", e.resource, err))
		}
		if !resp.Succeeded {
			b.untrack(e)
			return notHeld()
		}
		b.mu.Lock()
		e.moveTo(ns)
		e.mod = resp.Header.Revision // the put's, which its deletion at the end compares
		g := ns.guaranteed(start)
		b.mu.Unlock()
		return max(0, min(ttl, g)-drift(ttl)), nil
	}
	if err := b.keepAliveOnce(ctx, s); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return notHeld()
		}
		return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", e.resource, err))
	}
	get, err := b.read(ctx, s.secs, e.key)
	if errors.Is(err, ErrRevisionWentBack) {
		return notHeld()
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Extend", e.resource, err))
	}
	if len(get.Kvs) == 0 || get.Kvs[0].CreateRevision != rev || get.Kvs[0].Lease != int64(s.id) {
		b.untrack(e)
		return notHeld()
	}
	b.mu.Lock()
	g := s.guaranteed(start)
	b.mu.Unlock()
	return max(0, min(ttl, g)-drift(ttl)), nil
}

// Release deletes h's key: the next key in create-revision order, the
// first waiter, then holds the lock. A grant that wrote no record through
// this Backend (only the election writes one, its leader's, through the
// Locker that holds it) is released by one deletion of its slot's key,
// with no compare (see "Slots" in entry.go); one that may have written a
// record, by one transaction that checks the key is still h's (its create
// revision and its holder id) and deletes the record with it if the
// grant wrote it.
//
// A record written for the grant through another Locker stays until its
// lease ends or the next grant's record replaces it; ReadRecord never
// returns it, since it checks that the record's token is the first key's.
func (b *Backend) Release(ctx context.Context, hh lockbackend.Hold) error {
	e := hh.(*entry)
	if b.ReleaseFirstKey {
		return b.releaseFirstKey(ctx, e)
	}
	b.mu.Lock()
	gone, rev, recorded := e.gone, e.rev, e.recorded
	if gone {
		b.mu.Unlock()
		return fmt.Errorf("etcdlock: Release %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	// The slot is the entry's alone until this deletion's reply (see
	// "Slots"), so the deletion needs no compare: the key on it is the
	// grant's, or none.
	plain := rev != 0 && !recorded && !b.OneSlot
	e.releasing++
	b.busy[e.key]++
	b.mu.Unlock()
	var deleted bool
	var err error
	if plain {
		deleted, err = b.deleteSlot(ctx, e)
	} else {
		deleted, err = b.deleteKey(ctx, e, rev, recorded)
	}
	b.mu.Lock()
	e.releasing--
	b.unbusyLocked(e.key)
	if err != nil {
		if plain && !b.KeepSlotOfLostRelease {
			// The deletion may land later, on whatever key the slot
			// then holds: the slot is never used again.
			e.retired = true
		} else {
			b.freeLocked(e)
		}
		b.mu.Unlock()
		// The key's end still stands: it goes then at the latest.
		return fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Release", e.resource, err))
	}
	if e.gone {
		// Its end (or another release) came while the deletion was in
		// flight, and left the slot to the releases.
		b.freeLocked(e)
	}
	// A release is the holder's own end of its grant, not a loss: Lost
	// stays open for it.
	e.released = deleted
	b.untrackLocked(e)
	b.mu.Unlock()
	if !deleted {
		return fmt.Errorf("etcdlock: Release %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	return nil
}

// releaseFirstKey is the broken variant ReleaseFirstKey: whatever key
// holds the lock now is deleted, the grant's own or another holder's.
func (b *Backend) releaseFirstKey(ctx context.Context, e *entry) error {
	get, err := b.cli.Get(ctx, b.holders(e.resource), clientv3.WithFirstCreate()...)
	if err == nil && len(get.Kvs) > 0 {
		_, err = b.cli.Delete(ctx, string(get.Kvs[0].Key))
	}
	b.mu.Lock()
	e.released = err == nil
	b.untrackLocked(e)
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, b.callErr(ctx, "Release", e.resource, err))
	}
	return nil
}

// TTL returns how long the server still holds h's key: what is left of its
// lease, in whole seconds rounded down, and no longer than its end.
func (b *Backend) TTL(ctx context.Context, hh lockbackend.Hold) (time.Duration, error) {
	e := hh.(*entry)
	b.mu.Lock()
	gone, rev, s, end := e.gone || e.ending || !e.end.After(time.Now()), e.rev, e.s, e.end
	b.mu.Unlock()
	if gone {
		// Its end passed: the key is being deleted.
		return 0, fmt.Errorf("etcdlock: TTL %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	get, err := b.read(ctx, s.secs, e.key)
	if errors.Is(err, ErrRevisionWentBack) {
		return 0, fmt.Errorf("etcdlock: TTL %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	if err != nil {
		return 0, b.callErr(ctx, "TTL", e.resource, err)
	}
	if len(get.Kvs) == 0 || get.Kvs[0].CreateRevision != rev {
		return 0, fmt.Errorf("etcdlock: TTL %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	resp, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(get.Kvs[0].Lease))
	if err != nil {
		return 0, b.callErr(ctx, "TTL", e.resource, err)
	}
	if resp.TTL <= 0 {
		return 0, fmt.Errorf("etcdlock: TTL %q: %w", e.resource, lockbackend.ErrNotHeld)
	}
	if get.Kvs[0].Lease != int64(s.id) {
		return time.Duration(resp.TTL) * time.Second, nil
	}
	return max(0, min(time.Duration(resp.TTL)*time.Second, time.Until(end))), nil
}

// Abandon deletes holder's key, whether it holds the lock (handed over
// while the waiter gave up) or waits in the queue; the next key then holds
// the lock. Deleting a key that is gone changes nothing. A deletion that
// fails is done again by the key's session. The deletion is conditional on
// the key's value, the holder id, so that one landing late leaves a later
// key on the same slot standing; a holder this process has no entry of
// has its keys found by their value.
func (b *Backend) Abandon(ctx context.Context, resource, holder, acq string) error {
	e := b.entryOf(resource, holder)
	var err error
	if e != nil {
		_, err = b.commit(ctx, b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(e.key), "=", holder)).
			Then(clientv3.OpDelete(e.key)))
	} else {
		err = b.abandonUnknown(ctx, resource, holder)
	}
	if err != nil {
		if e != nil {
			b.mu.Lock()
			e.forget()
			e.endAt(time.Now(), false)
			b.mu.Unlock()
		}
		return b.callErr(ctx, "Abandon", resource, err)
	}
	if e != nil {
		b.mu.Lock()
		if time.Now().Before(e.late) {
			// A lost try's put may still land: the ticks look for it.
			e.endAt(time.Now(), false)
		} else {
			b.untrackLocked(e)
		}
		b.mu.Unlock()
	}
	return nil
}

// abandonUnknown deletes the keys of resource whose value is holder: the
// keys of an acquisition this process keeps no entry of.
func (b *Backend) abandonUnknown(ctx context.Context, resource, holder string) error {
	get, err := b.cli.Get(ctx, b.holders(resource), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	for _, kv := range get.Kvs {
		if string(kv.Value) != holder {
			continue
		}
		k := string(kv.Key)
		if _, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", holder),
				clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(k)).
			Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the watches of waiting acquisitions and the keep-alives, and
// waits, until deadline at most, for the deletions it sent in the
// background. It releases no lease: the keys of live grants end with their
// leases' TTL, from the last keep-alive. A session with no live key left is
// revoked, which deletes any key whose deletion had failed.
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
	var idle []clientv3.LeaseID
	for _, s := range b.sessions {
		live := false
		for e := range s.entries {
			if e.timer != nil {
				e.timer.Stop()
			}
			live = live || !e.overdue(time.Now())
		}
		// A call in flight may be putting a key on it (a try that Close
		// does not wait for): its lease then ends with its TTL.
		if !live && s.inflight == 0 {
			idle = append(idle, s.id)
		}
		s.dead = true
		s.cancel()
	}
	b.sessions = map[int64]*session{}
	b.mu.Unlock()
	for _, r := range rooms {
		r.cancel()
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for _, id := range idle {
		_, _ = b.cli.Revoke(ctx, id)
	}
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
