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
type entry struct {
	b                     *Backend
	resource, holder, key string
	ttl                   time.Duration

	// Fields below are guarded by Backend.mu.
	s     *session
	rev   int64     // the key's create revision; 0 when not known
	mod   int64     // the revision of this process's last put of the key
	sent  time.Time // when the try that made that put began
	end   time.Time // when the key is deleted, unless extended
	timer *time.Timer
	gone  bool // the key is deleted, or its lease ended
}

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
// if the deletion fails, its session's next tick tries again.
func (b *Backend) expire(ctx context.Context, e *entry) {
	if b.frozen.Load() == 2 {
		return
	}
	b.mu.Lock()
	if !e.overdue(time.Now()) {
		b.mu.Unlock()
		return
	}
	rev := e.rev
	b.mu.Unlock()
	if _, err := b.deleteKey(ctx, e.resource, e.key, rev); err == nil {
		b.untrack(e)
	}
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
