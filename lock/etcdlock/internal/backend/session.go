package backend

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A session is one etcd lease that a Backend shares among the keys it puts
// for one lease length (whole seconds), as concurrency.Session does for
// concurrency.Mutex: granted once, kept alive by the backend while keys
// stand on it, revoked once it has been idle for its TTL. A try is then
// one write, the transaction that puts the key on it and returns the
// token, and a release is one more, the deletion of the key.
//
// What a key on a session is promised is what the server acknowledged: the
// lease lives at least ackTTL from ackSent, when the last keep-alive (or
// the grant) the server answered was sent. A holder believes no more than
// that (less the drift allowance), and since the session keeps the lease
// alive past what any one lock asked for, each key also has an end of its
// own (entry.end), at which the backend deletes it unless it was extended.
// A paused or dead process sends no keep-alive, so the server expires the
// lease, and every key on it, within ackTTL of the last one.

// keepAlives is how many keep-alives a session sends per lease TTL: a
// grant on it then believes at least 4/5 of the TTL while the stream of
// keep-alives is healthy.
const keepAlives = 5

type session struct {
	secs   int64 // the TTL asked for
	id     clientv3.LeaseID
	cancel context.CancelFunc // ends the keep-alive loop

	// Fields below are guarded by Backend.mu.
	ackSent  time.Time     // when the last acknowledged keep-alive or grant was sent
	ackTTL   time.Duration // the TTL the server answered it with
	entries  map[*entry]struct{}
	inflight int // calls using the lease right now
	lastUse  time.Time
	dead     bool // gone from the server, revoked, or no longer used
	// orphans are the keys of lost tries on this lease whose puts were
	// not seen to land within lateApply: each keep-alive tick looks for
	// them, for as long as the lease lives, and deletes any that stands.
	// They do not keep the lease alive: when it ends, so would they.
	orphans []orphan
}

// orphan is a retired slot's key and the holder id its lost put would
// write there.
type orphan struct{ key, holder string }

// maxOrphans bounds a session's watch of late puts.
const maxOrphans = 64

// guaranteed is how long from now the server holds the lease at least.
func (s *session) guaranteed(now time.Time) time.Duration {
	return s.ackSent.Add(s.ackTTL).Sub(now)
}

func (s *session) interval() time.Duration { return s.ackTTL / keepAlives }

// session returns the live session of secs seconds, granting it if there
// is none, with one call more counted on it: the caller calls done. A
// session whose last acknowledged keep-alive is old (its stream of
// keep-alives is failing or late) is kept alive once first, so that a
// grant on it is not told little.
func (b *Backend) session(ctx context.Context, secs int64) (*session, error) {
	now := time.Now()
	b.mu.Lock()
	s := b.sessions[secs]
	if s != nil && !s.dead {
		s.inflight++
		s.lastUse = now
		stale := s.guaranteed(now) < s.ackTTL*(keepAlives-2)/keepAlives
		b.mu.Unlock()
		if !stale {
			return s, nil
		}
		err := b.keepAliveOnce(ctx, s)
		if err == nil {
			return s, nil
		}
		b.done(s)
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, err
		}
		// The lease ended (a pause or a cut longer than its TTL): a new one.
	} else {
		b.mu.Unlock()
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		// Nothing is kept alive after Close: a lease granted now would
		// serve one call and stand, idle, for its TTL.
		return nil, errClosed
	}
	sent := time.Now()
	lg, err := b.cli.Grant(ctx, secs)
	if err != nil {
		// A lease granted whose reply was lost holds no key, and the
		// server expires it.
		return nil, err
	}
	s = &session{secs: secs, id: lg.ID, ackSent: sent, ackTTL: time.Duration(lg.TTL) * time.Second,
		entries: map[*entry]struct{}{}, inflight: 1, lastUse: sent}
	b.mu.Lock()
	if old := b.sessions[secs]; old != nil && !old.dead && !b.closed {
		// Another call granted one meanwhile: use it, give this one back.
		old.inflight++
		old.lastUse = time.Now()
		b.mu.Unlock()
		b.revokeLater(context.WithoutCancel(ctx), lg.ID)
		return old, nil
	}
	if b.closed {
		// Closed while the grant was in flight: nothing keeps it alive,
		// and nothing uses it.
		b.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		_, _ = b.cli.Revoke(rctx, lg.ID)
		cancel()
		return nil, errClosed
	}
	b.sessions[secs] = s
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(lctx, s)
	return s, nil
}

// done ends a call counted by session.
func (b *Backend) done(s *session) {
	b.mu.Lock()
	s.inflight--
	s.lastUse = time.Now()
	b.mu.Unlock()
}

// keepAliveOnce keeps s's lease alive and notes what the server
// acknowledged. A lease the server no longer has ends the session, as
// does an answer that shows the cluster went back (see observe). Each
// attempt is bounded by a part of the lease's TTL (see attempts).
func (b *Backend) keepAliveOnce(ctx context.Context, s *session) error {
	if b.frozen.Load() != 0 {
		return ctx.Err()
	}
	b.mu.Lock()
	ttl := s.ackTTL
	b.mu.Unlock()
	type ack struct {
		resp *clientv3.LeaseKeepAliveResponse
		sent time.Time
	}
	a, err := attempts(ctx, ttl, func(ctx context.Context) (ack, error) {
		sent := time.Now()
		_, sentTerm := b.seen()
		resp, err := b.cli.KeepAliveOnce(ctx, s.id)
		if err == nil && !b.observe(0, sentTerm, resp.ResponseHeader, false) {
			err = rpctypes.ErrLeaseNotFound // every session ended with the cluster of before
		}
		return ack{resp, sent}, err
	})
	resp, sent := a.resp, a.sent
	if err == nil && resp.TTL <= 0 {
		err = rpctypes.ErrLeaseNotFound
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			b.lost(s)
		}
		return err
	}
	b.mu.Lock()
	if sent.After(s.ackSent) {
		s.ackSent, s.ackTTL = sent, time.Duration(resp.TTL)*time.Second
	}
	b.mu.Unlock()
	return nil
}

// attemptPart is the part of a lease's TTL that one attempt of a
// renewal or a read waits for its member: the client sends requests to
// its members in turn, and a member cut off from its peers while its
// clients still reach it takes them and never answers (it can neither
// forward a renewal to the leader nor confirm a read with it). Given up
// on after this, the request goes to the next member. A fifth of the TTL
// leaves a renewal made with a third of it left two more attempts.
const attemptPart = 5

// minAttempt bounds an attempt below, for short TTLs on a loaded machine.
const minAttempt = 500 * time.Millisecond

// attempts runs call, idempotent, until one attempt answers or ctx
// ends. An attempt that has not answered within ttl/attemptPart is not
// waited for alone: another starts, which the client sends to its next
// member, and the first answer of any wins (the slower attempts are then
// cancelled). A slow member on a loaded machine still answers; a member
// cut off from its peers no longer holds the call until its deadline. At
// most maxAttempts run at once (one per member of a three-member
// cluster).
func attempts[T any](ctx context.Context, ttl time.Duration, call func(ctx context.Context) (T, error)) (T, error) {
	part := max(ttl/attemptPart, minAttempt)
	// A member that knows it has no leader (cut off from its peers past
	// an election timeout) then refuses at once, and the client sends the
	// request again to another.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	type result struct {
		v   T
		err error
	}
	results := make(chan result, maxAttempts)
	running, started := 0, 0
	start := func() {
		running++
		started++
		go func() {
			v, err := call(ctx)
			results <- result{v, err}
		}()
	}
	start()
	t := time.NewTimer(part)
	defer t.Stop()
	var last error
	for {
		select {
		case r := <-results:
			running--
			if r.err == nil || ctx.Err() != nil || !transient(r.err) {
				return r.v, r.err
			}
			last = r.err
			if running == 0 {
				if started >= maxAttempts {
					var zero T
					return zero, last
				}
				start()
			}
		case <-t.C:
			if running < maxAttempts && started < maxAttempts {
				start()
			}
			t.Reset(part)
		case <-ctx.Done():
			var zero T
			if last == nil {
				last = ctx.Err()
			}
			return zero, last
		}
	}
}

// maxAttempts bounds the attempts of one call.
const maxAttempts = 3

// transient says err may be a member's own trouble, which another member
// would not have (its connection failed, it is unavailable or cut off):
// every error but the answers that speak for the cluster.
func transient(err error) bool {
	return !errors.Is(err, rpctypes.ErrLeaseNotFound) && !errors.Is(err, ErrRevisionWentBack)
}

// keepAlive keeps s's lease alive while keys stand on it or calls use it,
// retries the deletions of keys whose end has passed, and revokes the
// lease once it has been idle for its TTL.
func (b *Backend) keepAlive(ctx context.Context, s *session) {
	defer b.wg.Done()
	b.mu.Lock()
	every := s.interval()
	b.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		b.mu.Lock()
		if s.dead {
			b.mu.Unlock()
			return
		}
		if len(s.entries) == 0 && s.inflight == 0 && now.Sub(s.lastUse) >= s.ackTTL {
			s.dead = true
			if b.sessions[s.secs] == s {
				delete(b.sessions, s.secs)
			}
			b.mu.Unlock()
			rctx, cancel := context.WithTimeout(ctx, cleanupBound)
			_, _ = b.cli.Revoke(rctx, s.id)
			cancel()
			return
		}
		var due []*entry
		for e := range s.entries {
			if e.overdue(now) {
				due = append(due, e)
			}
		}
		b.mu.Unlock()
		for _, e := range due {
			// Bounded, so that a deletion that hangs does not hold up
			// the keep-alives.
			dctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
			b.expire(dctx, e)
			cancel()
		}
		if b.frozen.Load() == 0 {
			octx, cancel := context.WithTimeout(ctx, max(every, time.Second))
			b.sweepOrphans(octx, s)
			cancel()
		}
		kctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		if b.keepAliveOnce(kctx, s) == nil {
			b.checkKeys(kctx, s)
		}
		cancel()
	}
}

// checkKeys asks the server which keys stand on s's lease, and ends at
// once the belief in every key of s that the server's answer should list
// and does not: a key deleted by another client, or one the cluster lost
// when it was restored from a backup taken before the key's put (with
// --bump-revision, so that no revision went back). Each such key's
// deletion at its end is done now, conditional on its put as usual, so a
// key the answer missed and that still stands goes too, and its slot
// is freed only once the key is known gone. A key of this Backend's slots
// that the answer lists and that no acquisition owns is deleted
// (dropUnowned).
func (b *Backend) checkKeys(ctx context.Context, s *session) {
	if b.frozen.Load() != 0 {
		return
	}
	b.mu.Lock()
	ttl := s.ackTTL
	b.mu.Unlock()
	// Asked even when no entry stands on s: calls that use it (tries
	// refused) keep it alive, and with it any key it holds that no
	// acquisition owns.
	resp, err := attempts(ctx, ttl, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return b.cli.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys())
	})
	if err != nil {
		return
	}
	if resp.TTL <= 0 {
		b.lost(s)
		return
	}
	keys := make(map[string]bool, len(resp.Keys))
	for _, k := range resp.Keys {
		keys[string(k)] = true
	}
	now := time.Now()
	var gone []*entry
	var unowned []string
	b.mu.Lock()
	owned := b.ownedLocked()
	for k := range keys {
		if b.mine(k) && !owned[k] {
			unowned = append(unowned, k)
		}
	}
	for e := range s.entries {
		if e.gone || e.trying || e.releasing > 0 || !e.late.IsZero() || e.mod == 0 ||
			e.mod > resp.ResponseHeader.Revision || keys[e.key] {
			continue
		}
		e.endAt(now, false)
		gone = append(gone, e)
	}
	b.mu.Unlock()
	for _, e := range gone {
		b.expire(ctx, e)
	}
	if len(unowned) > 0 {
		b.dropUnowned(ctx, unowned)
	}
}

// mine reports whether key names one of this Backend's slots.
func (b *Backend) mine(key string) bool {
	return strings.HasPrefix(key, b.prefix+"{") && strings.Contains(key[len(b.prefix):], "}/h/"+b.id+".")
}

// ownedLocked returns the keys of this Backend's slots that an acquisition
// owns: an entry has it, or a try or a release of it is in flight. A key
// of its slots on one of its leases that none owns is believed by nobody:
// a key that came back when the cluster was restored from a backup taken
// before its deletion (with --bump-revision), or the put of a try whose
// reply was lost that landed after the backend stopped looking for it.
// Backend.mu is held.
func (b *Backend) ownedLocked() map[string]bool {
	owned := make(map[string]bool, len(b.entries)+len(b.busy))
	for _, e := range b.entries {
		owned[e.key] = true
	}
	for k := range b.busy {
		owned[k] = true
	}
	return owned
}

// dropUnowned deletes the keys of this Backend's slots that a keep-alive
// tick found on one of its leases and that no acquisition owns (see
// ownedLocked): each stood on a lease this process keeps alive for
// other keys, so it would hold its lock, or its place in the queue, for
// nobody until the lease ended. A key is read first and deleted only as
// read, and only if no acquisition took its slot meanwhile: a try that
// takes it later puts after the read, so the deletion's compare fails, or
// it lands before that put, which then makes a new key.
func (b *Backend) dropUnowned(ctx context.Context, keys []string) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return
	}
	for i, k := range keys {
		kv := kvOf(resp.Responses[i])
		if kv == nil {
			continue
		}
		b.mu.Lock()
		owned := b.ownedLocked()[k]
		b.mu.Unlock()
		if owned {
			continue
		}
		if _, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision),
				clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(k)).
			Commit(); err != nil {
			return
		}
	}
}

// sweepOrphans looks, in one read, for the keys of s's watch of late puts,
// and deletes each that stands and still holds its lost try's holder id: a
// retired slot's name is never given to another acquisition, so a key
// there is that put's.
func (b *Backend) sweepOrphans(ctx context.Context, s *session) {
	b.mu.Lock()
	watch := append([]orphan(nil), s.orphans...)
	b.mu.Unlock()
	if len(watch) == 0 {
		return
	}
	ops := make([]clientv3.Op, len(watch))
	for i, o := range watch {
		ops[i] = clientv3.OpGet(o.key, clientv3.WithCountOnly())
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return
	}
	for i, o := range watch {
		if rr := resp.Responses[i].GetResponseRange(); rr == nil || rr.Count == 0 {
			continue
		}
		del, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(o.key), "=", o.holder)).
			Then(clientv3.OpDelete(o.key)).
			Commit()
		if err != nil || !del.Succeeded {
			continue
		}
		b.mu.Lock()
		for j, w := range s.orphans {
			if w == o {
				s.orphans = append(s.orphans[:j:j], s.orphans[j+1:]...)
				break
			}
		}
		b.mu.Unlock()
	}
}

// lost ends s after the server said its lease is gone: every key on it
// went with it.
func (b *Backend) lost(s *session) {
	b.mu.Lock()
	s.dead = true
	if b.sessions[s.secs] == s {
		delete(b.sessions, s.secs)
	}
	es := make([]*entry, 0, len(s.entries))
	for e := range s.entries {
		es = append(es, e)
	}
	b.mu.Unlock()
	for _, e := range es {
		b.untrack(e)
	}
	if s.cancel != nil {
		s.cancel()
	}
}

// Freeze makes the backend act as a paused process for tests: no
// keep-alive is sent, and with ends, no key is deleted at its end, until
// Thaw.
func (b *Backend) Freeze(ends bool) {
	if ends {
		b.frozen.Store(2)
	} else {
		b.frozen.Store(1)
	}
}

// Thaw undoes Freeze.
func (b *Backend) Thaw() { b.frozen.Store(0) }
