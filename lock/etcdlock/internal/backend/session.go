package backend

import (
	"context"
	"errors"
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
		// No keep-alive runs after Close: the lease serves this call's
		// keys alone, which then end with its TTL.
		s.dead = true
		b.mu.Unlock()
		return s, nil
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
// acknowledged. A lease the server no longer has ends the session.
func (b *Backend) keepAliveOnce(ctx context.Context, s *session) error {
	if b.frozen.Load() != 0 {
		return ctx.Err()
	}
	sent := time.Now()
	resp, err := b.cli.KeepAliveOnce(ctx, s.id)
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
		_ = b.keepAliveOnce(kctx, s)
		cancel()
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
