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
//
// # Slots
//
// A key is named by a slot, not by its holder: the Backend's id and a
// number, which goes back to its resource's free list once the key is
// gone, so that the next acquisition of the resource in this process puts
// the same key again. Numbers come from one counter of the Backend, so a
// resource whose free list was dropped (idle for slotsIdle) gets new
// names, never a retired one. etcd keeps a deleted key in its index until the
// cluster compacts, and every grant's emptiness check and every read of
// the first key walk the directory's index: with a fresh name per grant
// that walk grew with every grant since the last compaction; with slots
// it covers as many names as the process ever held at once. The value of
// the key is the holder id, and what the backend knows of a key it finds
// by it, or by its create revision.
//
// Reusing a name is safe because nothing this process sent about a slot's
// last key can land on its next one:
//
//   - A try whose reply was lost may have its put applied up to lateApply
//     later, after a deletion sent since: its slot is retired (never goes
//     back to the free list), and its entry stays until lateApply has
//     passed, each keep-alive tick deleting the key should it land; after
//     that its session's watch of late puts looks for it at every tick
//     (session.orphans).
//   - Every deletion but a release's compares the key's value with the
//     holder id (an extension's move also its create revision): a
//     deletion whose reply was lost and that lands late finds the next
//     key of the slot under another holder id, and changes nothing.
//   - A release deletes its slot's key with no compare, as
//     concurrency.Mutex's Unlock does (a compare costs each member a read
//     of the key, about 2% of an uncontended lock and unlock): the slot
//     is its entry's alone until the release's reply, so the key on it is
//     the grant's or none. A release whose reply was lost retires the
//     slot, since its deletion may land on the slot's next key.
//   - A slot is freed only once its key is known gone (a deletion
//     acknowledged, or its lease ended), never while a try or a release
//     of its entry is in flight (the entry is made before the put and
//     freed only after its reply, or retired; a key whose end comes while
//     its release is in flight leaves its slot to the release).
//   - A restore from a backup taken before a slot's key was deleted
//     brings the key back, with its create revision of before, on a lease
//     the process may still keep alive: a try's put returns the key it
//     replaced, and one this acquisition did not make (another holder id,
//     or another create revision than the entry knew) is deleted, its
//     slot and its resource's free slots retired (Backend.stale), and
//     each keep-alive tick deletes the keys of the Backend's slots on its
//     lease that no acquisition owns (checkKeys).
//
// A key's token stays the create revision: a name put again after its
// deletion gets a new one, above every earlier, and a queued waiter's
// refresh (a put of a standing key) keeps it.
type entry struct {
	b                     *Backend
	resource, holder, key string
	slot                  int64
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
	// landed says a deletion found the put of a lost try and deleted it:
	// a request is applied at most once, so nothing of it can land again.
	landed bool
	gone   bool // the key is deleted, or its lease ended
	// retired says the slot never goes back to the free list: a put of
	// the key may land after the entry is gone.
	retired bool
	// trying says a try of the entry is in flight: its slot stays the
	// try's even if the entry goes meanwhile.
	trying bool
	// releasing counts the releases of the entry in flight: its slot is
	// not freed until every one's reply has come (see Backend.Release).
	releasing int
	// lostc, once made by Lost, closes when no belief in the key may
	// last (unbelieve).
	lostc    chan struct{}
	lostDone bool
	released bool // its release deleted the key: no loss to signal
	// recorded says a record may have been written through this entry
	// (PutRecord, or an extension that moved a record): its release
	// deletes the record with the key.
	recorded bool
}

// Lost returns a channel that closes once no belief in the grant may
// last: its key is known gone other than by its own release (deleted at
// its end, found missing, or gone with its lease: revoked, expired, or of
// a cluster that went back), or its end passed. The session's keep-alive learns of a
// lease revoked or a key gone within a keep-alive interval (a fifth of the
// lease's TTL) and a round trip.
func (e *entry) Lost() <-chan struct{} {
	if e.b.IgnoreLoss {
		return nil // never closes
	}
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	if e.lostc == nil {
		e.lostc = make(chan struct{})
		if e.gone || e.ending {
			e.unbelieveLocked()
		}
	}
	return e.lostc
}

// unbelieveLocked closes e's Lost channel. Backend.mu is held.
func (e *entry) unbelieveLocked() {
	if e.lostc != nil && !e.lostDone && !e.released {
		e.lostDone = true
		close(e.lostc)
	}
}

// holderRef names an acquisition: its resource and holder id.
type holderRef struct{ resource, holder string }

// slots are one resource's slot numbers in this process.
type slots struct {
	free []int64   // numbers whose last key is gone, last freed last
	used int       // numbers held by entries
	idle time.Time // when used last fell to 0
}

// slotsIdle is how long a resource's free list outlives its last key:
// after it, the resource's next acquisition takes a fresh number (one
// more name in etcd's index until it compacts), and the process keeps no
// state for resources it no longer locks.
const slotsIdle = time.Minute

// lateApply bounds how long after a try's reply was lost its put may still
// be applied: etcd answers a request it could not commit within its
// request timeout (7 s with default timings) with an error, and this
// leaves twice that.
const lateApply = 15 * time.Second

// overdue reports whether e's end passed without its key being deleted.
// Backend.mu is held.
func (e *entry) overdue(now time.Time) bool { return !e.gone && !e.end.After(now) }

// reserve returns the live entry of resource and holder, or one made now
// on a slot of its own, standing on no session yet. Backend.mu is held.
func (b *Backend) reserve(resource, holder string, ttl time.Duration) *entry {
	ref := holderRef{resource, holder}
	if e := b.entries[ref]; e != nil && !e.gone {
		return e
	}
	now := time.Now()
	if now.Sub(b.swept) >= slotsIdle {
		b.swept = now
		for r, sl := range b.slots {
			if sl.used == 0 && now.Sub(sl.idle) >= slotsIdle {
				delete(b.slots, r)
			}
		}
	}
	sl := b.slots[resource]
	if sl == nil {
		sl = &slots{}
		b.slots[resource] = sl
	}
	var n int64
	switch k := len(sl.free); {
	case b.OneSlot: // a broken variant: slot 0, whatever stands on it
	case k > 0:
		n, sl.free = sl.free[k-1], sl.free[:k-1]
	default:
		n = b.nextSlot
		b.nextSlot++
	}
	sl.used++
	e := &entry{b: b, resource: resource, holder: holder, slot: n, key: b.slotKey(resource, n), ttl: ttl}
	b.entries[ref] = e
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

// forget makes e's deletion delete whatever key of its holder stands on
// its slot, judged by its value alone: the acquisition is over (a reply
// was lost, or the waiter gave up), so nobody believes in the key, and a
// put whose reply was lost may have made it again under revisions this
// process never heard of.
// Backend.mu is held.
func (e *entry) forget() { e.rev, e.mod = 0, 0 }

// entryOf returns the live entry of resource and holder, or nil.
func (b *Backend) entryOf(resource, holder string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[holderRef{resource, holder}]; e != nil && !e.gone {
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
	e.unbelieveLocked()
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
				b.mu.Lock()
				b.watchLocked(e)
				b.untrackLocked(e)
				b.mu.Unlock()
			}
			return
		}
	}
	deleted, present, err := b.deleteAtEnd(ctx, e, rev, mod)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !late.IsZero() && deleted {
		e.landed = true
	}
	if e.rev == rev && e.mod == mod && (deleted || !present) && !time.Now().Before(e.late) {
		// Not put again since the decision, and no lost put can land
		// any more: the key is gone.
		b.watchLocked(e)
		b.untrackLocked(e)
	}
}

// watchLocked hands the key of e, a lost try's whose put was never seen
// to land, to its session's watch of late puts (session.orphans): lateApply
// bounds when a put given up by its client is applied only as far as the
// cluster's timings go, and a put that lands later still would stand on
// a lease the process keeps alive for other keys. Backend.mu is held.
func (b *Backend) watchLocked(e *entry) {
	if e.gone || e.late.IsZero() || e.landed || e.s == nil || e.s.dead {
		return
	}
	s := e.s
	if len(s.orphans) == maxOrphans {
		// The oldest is dropped: its put has had the longest to land.
		s.orphans = s.orphans[1:]
	}
	s.orphans = append(s.orphans, orphan{key: e.key, holder: e.holder})
}

// deleteAtEnd deletes e's key as the put of create revision rev and mod
// revision mod left it (either 0 when not known: then any such key), if
// its value is still e's holder id, with the record of the grant of rev;
// it reports whether it deleted the key, and, when not, whether a key
// stands there.
func (b *Backend) deleteAtEnd(ctx context.Context, e *entry, rev, mod int64) (deleted, present bool, err error) {
	key := e.key
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", e.holder)}
	then := []clientv3.Op{clientv3.OpDelete(key)}
	if rev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", rev))
		then = append(then, b.dropRecord(e.resource, rev))
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

// deleteKey deletes e's key if it is the key of create revision rev (when
// rev is known) and its value e's holder id, with the record its grant
// wrote when record says it may have written one; it reports whether a
// key was deleted.
func (b *Backend) deleteKey(ctx context.Context, e *entry, rev int64, record bool) (bool, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(e.key), "=", e.holder)}
	then := []clientv3.Op{clientv3.OpDelete(e.key)}
	if rev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(e.key), "=", rev))
		if record {
			then = append(then, b.dropRecord(e.resource, rev))
		}
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(then...).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded && resp.Responses[0].GetResponseDeleteRange().Deleted > 0, nil
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

// deleteSlot deletes e's key, whatever put it holds, and reports whether
// one stood: for a release only, while the slot is its entry's alone.
func (b *Backend) deleteSlot(ctx context.Context, e *entry) (bool, error) {
	var resp *clientv3.DeleteResponse
	var err error
	if b.SendDelete != nil {
		resp, err = b.SendDelete(ctx, e.key)
	} else {
		resp, err = b.cli.Delete(ctx, e.key)
	}
	if err != nil {
		return false, err
	}
	return resp.Deleted > 0, nil
}

// freeLocked puts the slot of e, gone while a release of it was in
// flight, back on its resource's free list, unless it is retired or a try
// or another release of it is in flight. Backend.mu is held.
func (b *Backend) freeLocked(e *entry) {
	if !e.gone || e.retired || e.trying || e.releasing > 0 || b.OneSlot {
		return
	}
	if sl := b.slots[e.resource]; sl != nil {
		sl.free = append(sl.free, e.slot)
	}
}

// untrack forgets e: its key is deleted, or went with its lease.
func (b *Backend) untrack(e *entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.untrackLocked(e)
}

// untrackLocked is untrack with Backend.mu held. e's slot goes back to its
// resource's free list, unless it is retired.
func (b *Backend) untrackLocked(e *entry) {
	if e.gone {
		return
	}
	e.gone = true
	e.unbelieveLocked()
	if e.timer != nil {
		e.timer.Stop()
	}
	if ref := (holderRef{e.resource, e.holder}); b.entries[ref] == e {
		delete(b.entries, ref)
	}
	if e.s != nil {
		delete(e.s.entries, e)
		e.s.lastUse = time.Now()
	}
	if sl := b.slots[e.resource]; sl != nil {
		if !e.retired && !e.trying && e.releasing == 0 && !b.OneSlot {
			// (A slot whose try or release is in flight passes to it:
			// see Backend.tried and Backend.Release.)
			sl.free = append(sl.free, e.slot)
		}
		if sl.used--; sl.used == 0 {
			sl.idle = time.Now()
		}
	}
}

// unbusyLocked ends one try or release of key counted in Backend.busy.
// Backend.mu is held.
func (b *Backend) unbusyLocked(key string) {
	if b.busy[key]--; b.busy[key] <= 0 {
		delete(b.busy, key)
	}
}
