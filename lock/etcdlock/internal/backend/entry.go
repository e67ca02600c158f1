package backend

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
)

// entry is a key this backend put under a resource's directory: a grant's
// (the Hold of Extend, Release and TTL) or a queued waiter's, which a
// release may turn into a grant. Its key stands on a session's lease,
// which outlives what the lock asked for, so the entry has an end of its
// own: a grant's TTL from its try, a queued waiter's the longer of its TTL
// and QueueLife from its last refresh. At its end the backend deletes the
// key, unless it was extended; a deletion that fails is tried again on
// each keep-alive tick of its session, which keeps the lease alive only
// while it lasts, so no key is left that nobody knows of.
//
// Every belief in a key (a grant's, an extension's, a hand-over's) ends
// no later than the entry's end as it stood when the belief was made, and
// an end moves earlier only for a key nobody believes in. Once the end has
// passed and the backend has decided to delete the key (ending), nothing
// believes in that put of the key again: Extend refuses, a hand-over is
// not announced, and the deletion only deletes the key as that put left it
// (its create and mod revisions), so that a queued waiter's refresh that
// put the key again meanwhile keeps it.
type entry struct {
	b                     *Backend
	resource, holder, key string
	ttl                   time.Duration

	// Fields below are guarded by Backend.mu.
	s     *session
	rev   int64     // the key's create revision; 0 when not known
	mod   int64     // the revision of this process's last put of the key; 0 when not known
	sent  time.Time // when the try that made that put began
	end   time.Time // when the key is deleted, unless extended
	timer *time.Timer
	// ending says the end passed and the key as put at mod is being
	// deleted: no holder may believe in it from now on. A put of the key
	// since (a queued waiter's refresh) clears it.
	ending bool
	// late is, for the key of a try whose reply was lost, until when its
	// put may still land: a request given up by its client may still be
	// applied by the cluster, after a deletion sent since. Until then the
	// entry stays, and each keep-alive tick looks for the key and deletes
	// it, since it stands on a lease the process keeps alive for others.
	late time.Time
	gone bool // the key is deleted, or its lease ended
}

// lateApply bounds how long after a try's reply was lost its put may still
// be applied: etcd answers a request it could not commit within its
// request timeout (7 s with default timings) with an error, and this
// leaves twice that.
const lateApply = 15 * time.Second

// overdue reports whether e's end passed without its key being deleted.
// Backend.mu is held.
func (e *entry) overdue(now time.Time) bool { return !e.gone && !e.end.After(now) }

// track returns the entry of key, made if this process has none, standing
// on s.
func (b *Backend) track(resource, holder string, ttl time.Duration, s *session) *entry {
	key := b.holderKey(resource, holder)
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || e.gone {
		e = &entry{b: b, resource: resource, holder: holder, key: key, ttl: ttl}
		b.entries[key] = e
	}
	e.moveTo(s)
	return e
}

// moveTo notes that e's key stands on s's lease now. Backend.mu is held.
func (e *entry) moveTo(s *session) {
	if e.s == s {
		return
	}
	if e.s != nil {
		delete(e.s.entries, e)
		e.s.lastUse = time.Now()
	}
	e.s = s
	s.entries[e] = struct{}{}
}

// forget makes e's deletion delete whatever key of its holder stands, with
// no condition: the acquisition is over (a reply was lost, or the waiter
// gave up), so nobody believes in the key, and a put whose reply was lost
// may have made it again under revisions this process never heard of.
// Backend.mu is held.
func (e *entry) forget() { e.rev, e.mod = 0, 0 }

// entryOf returns the live entry of key, or nil.
func (b *Backend) entryOf(key string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil && !e.gone {
		return e
	}
	return nil
}

// endAt sets when e's key is deleted: with later, never earlier than
// before. Backend.mu is held.
func (e *entry) endAt(t time.Time, later bool) {
	if e.gone || (later && !t.After(e.end)) {
		return
	}
	e.end = t
	if e.b.closed {
		// Nothing is kept alive after Close: the key ends with its lease.
		return
	}
	d := time.Until(t)
	if e.timer == nil {
		e.timer = time.AfterFunc(d, e.fire)
	} else {
		e.timer.Reset(d)
	}
}

// fire deletes e's key at its end.
func (e *entry) fire() {
	b := e.b
	b.mu.Lock()
	if b.closed || !e.overdue(time.Now()) || b.frozen.Load() == 2 {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
	defer cancel()
	go func() {
		select {
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	b.expire(ctx, e)
}

// expire deletes e's key, whose end passed, with the record of its grant;
// if the deletion fails, its session's next tick tries again. The decision
// and the end it judged are one step under Backend.mu, after which no
// holder believes in the key as last put (see entry); the deletion is
// conditional on that put, so a put of the key since keeps it.
func (b *Backend) expire(ctx context.Context, e *entry) {
	if b.frozen.Load() == 2 {
		return
	}
	b.mu.Lock()
	if !e.overdue(time.Now()) {
		b.mu.Unlock()
		return
	}
	e.ending = true
	rev, mod, late := e.rev, e.mod, e.late
	b.mu.Unlock()
	if b.BeforeEndDelete != nil {
		b.BeforeEndDelete()
	}
	if !late.IsZero() {
		// A lost try's key: look, and send a deletion only when it stands.
		get, err := b.cli.Get(ctx, e.key, clientv3.WithCountOnly())
		if err != nil {
			return
		}
		if get.Count == 0 {
			if !time.Now().Before(late) {
				b.untrack(e)
			}
			return
		}
	}
	deleted, present, err := b.deleteAtEnd(ctx, e.resource, e.key, rev, mod)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.rev == rev && e.mod == mod && (deleted || !present) && !time.Now().Before(e.late) {
		// Not put again since the decision, and no lost put can land
		// any more: the key is gone.
		b.untrackLocked(e)
	}
}

// deleteAtEnd deletes key as the put of create revision rev and mod
// revision mod left it (either 0 when not known: then any such key), with
// the record of the grant of rev; it reports whether it deleted the key,
// and, when not, whether a key stands there.
func (b *Backend) deleteAtEnd(ctx context.Context, resource, key string, rev, mod int64) (deleted, present bool, err error) {
	var cmps []clientv3.Cmp
	then := []clientv3.Op{clientv3.OpDelete(key)}
	if rev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", rev))
		then = append(then, b.dropRecord(resource, rev))
	}
	if mod != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(then...).Else(clientv3.OpGet(key, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false, false, err
	}
	if resp.Succeeded {
		return resp.Responses[0].GetResponseDeleteRange().Deleted > 0, false, nil
	}
	rr := resp.Responses[0].GetResponseRange()
	return false, rr != nil && rr.Count > 0, nil
}

// deleteKey deletes key and, when rev is known, only the key of that
// create revision, with the record its grant wrote; it reports whether a
// key was deleted.
func (b *Backend) deleteKey(ctx context.Context, resource, key string, rev int64) (bool, error) {
	if rev == 0 {
		resp, err := b.cli.Delete(ctx, key)
		if err != nil {
			return false, err
		}
		return resp.Deleted > 0, nil
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key), b.dropRecord(resource, rev)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// dropRecord deletes resource's record if the grant of create revision rev
// wrote it: a record's value starts with its token in 16 digits and a
// newline, so the grant's records are the values above those 16 digits
// and below them followed by "\v" (etcd compares with =, !=, < and >
// only).
func (b *Backend) dropRecord(resource string, rev int64) clientv3.Op {
	rkey := b.recordKey(resource)
	tok := fmt.Sprintf("%016d", int64(TokenBase+fence.Token(rev)))
	return clientv3.OpTxn(
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.Value(rkey), ">", tok),
			clientv3.Compare(clientv3.Value(rkey), "<", tok+"\v"),
		},
		[]clientv3.Op{clientv3.OpDelete(rkey)}, nil)
}

// untrack forgets e: its key is deleted, or went with its lease.
func (b *Backend) untrack(e *entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.untrackLocked(e)
}

// untrackLocked is untrack with Backend.mu held.
func (b *Backend) untrackLocked(e *entry) {
	if e.gone {
		return
	}
	e.gone = true
	if e.timer != nil {
		e.timer.Stop()
	}
	if b.entries[e.key] == e {
		delete(b.entries, e.key)
	}
	if e.s != nil {
		delete(e.s.entries, e)
		e.s.lastUse = time.Now()
	}
}
