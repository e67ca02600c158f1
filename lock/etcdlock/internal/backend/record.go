package backend

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// PutRecord writes value as f's record, on the lease of f's key, in one
// transaction that checks that f's key still holds the lock (its create
// revision is f's token's) and that the record names no newer grant. The
// record lives as long as the lock: on etcd a token never goes back, so
// the record need not outlive the lock to keep its token's order, and
// linger is not used.
func (b *Backend) PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error {
	if f.Token <= TokenBase {
		return fmt.Errorf("%w: etcdlock: PutRecord: token %d was not issued by an etcd lock", fence.ErrInvalid, f.Token)
	}
	rkey := b.recordKey(f.Resource)
	rev := int64(f.Token - TokenBase)
	if b.RecordUnchecked {
		_, err := b.cli.Txn(ctx).Then(clientv3.OpPut(rkey, formatRecord(f.Token, value))).Commit()
		if err != nil {
			return b.callErr(ctx, "PutRecord", f.Resource, err)
		}
		return nil
	}
	kv, err := b.fenceKey(ctx, f, true)
	if err != nil {
		return b.callErr(ctx, "PutRecord", f.Resource, err)
	}
	if kv == nil {
		return fmt.Errorf("etcdlock: PutRecord %q: %w", f.Resource, lockbackend.ErrNotHeld)
	}
	key := string(kv.Key)
	lease := clientv3.LeaseID(kv.Lease)
	// The record's value starts with its token in 16 digits, so that it
	// sorts above every record of an older grant.
	newer := formatRecord(f.Token, "\xff")
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev),
			clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(rkey), ">", newer)},
			[]clientv3.Op{clientv3.OpGet(rkey)},
			[]clientv3.Op{clientv3.OpPut(rkey, formatRecord(f.Token, value), clientv3.WithLease(lease))})).
		Commit()
	if err != nil {
		return b.callErr(ctx, "PutRecord", f.Resource, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdlock: PutRecord %q: %w", f.Resource, lockbackend.ErrNotHeld)
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner != nil && inner.Succeeded {
		tok := fence.Token(0)
		if rr := inner.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			if rec, ok := parseRecord(rr.Kvs[0].Value); ok {
				tok = rec.Token
			}
		}
		return &lockbackend.NewerRecordError{Resource: f.Resource, Token: tok}
	}
	return nil
}

// fenceKey reads the key of f's grant: the key of this process's entry of
// f's holder, or, for a grant this process keeps no entry of, the first
// key of the resource, which is f's while f's grant holds the lock (a key
// created after it comes after it). It returns nil when no key of f's
// create revision and holder id stands. With record, the entry notes that
// its release must delete the record too.
func (b *Backend) fenceKey(ctx context.Context, f fence.Fence, record bool) (*mvccpb.KeyValue, error) {
	rev := int64(f.Token - TokenBase)
	var get *clientv3.GetResponse
	var err error
	if e := b.entryOf(f.Resource, f.Holder); e != nil {
		if record {
			b.mu.Lock()
			e.recorded = true
			b.mu.Unlock()
		}
		get, err = b.cli.Get(ctx, e.key)
	} else {
		get, err = b.cli.Get(ctx, b.holders(f.Resource), clientv3.WithFirstCreate()...)
	}
	if err != nil {
		return nil, err
	}
	if len(get.Kvs) == 0 || get.Kvs[0].CreateRevision != rev || string(get.Kvs[0].Value) != f.Holder {
		return nil, nil
	}
	return get.Kvs[0], nil
}

// KeepRecord checks that f's record and lock still stand: the record is on
// the lock's lease and is deleted with the lock's key, so it lasts exactly
// as long as the lock does.
func (b *Backend) KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error {
	hold := clientv3.OpGet(b.holders(f.Resource), clientv3.WithFirstCreate()...)
	if e := b.entryOf(f.Resource, f.Holder); e != nil {
		hold = clientv3.OpGet(e.key)
	}
	resp, err := b.cli.Txn(ctx).Then(hold, clientv3.OpGet(b.recordKey(f.Resource))).Commit()
	if err != nil {
		return b.callErr(ctx, "KeepRecord", f.Resource, err)
	}
	h, r := kvOf(resp.Responses[0]), kvOf(resp.Responses[1])
	if h == nil || h.CreateRevision != int64(f.Token-TokenBase) || string(h.Value) != f.Holder || r == nil {
		return fmt.Errorf("etcdlock: KeepRecord %q: %w", f.Resource, lockbackend.ErrNotHeld)
	}
	if rec, ok := parseRecord(r.Value); !ok || rec.Token != f.Token {
		return fmt.Errorf("etcdlock: KeepRecord %q: %w", f.Resource, lockbackend.ErrNotHeld)
	}
	return nil
}

// ReadRecord reads the first holder key and the record in one
// transaction, a linearizable read: the record is returned only when it
// was written by the grant that holds the lock.
func (b *Backend) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.holders(resource), clientv3.WithFirstCreate()...),
		clientv3.OpGet(b.recordKey(resource))).Commit()
	if err != nil {
		return lockbackend.Record{}, b.callErr(ctx, "ReadRecord", resource, err)
	}
	h, r := kvOf(resp.Responses[0]), kvOf(resp.Responses[1])
	if h == nil || r == nil {
		return lockbackend.Record{}, lockbackend.ErrNoRecord
	}
	rec, ok := parseRecord(r.Value)
	tok, err := token(h.CreateRevision)
	if !ok || err != nil || rec.Token != tok {
		return lockbackend.Record{}, lockbackend.ErrNoRecord
	}
	return rec, nil
}

// WatchRecord sends each record written for resource, heard through an
// etcd watch on a member that has a leader, until ctx ends. A watch that
// breaks starts again from the revision after the last event it sent, so
// a record written meanwhile is sent too; one whose revision the cluster
// compacted meanwhile reads the current record instead, sends it, and
// resumes after that read. Watches that keep failing (a member with no
// leader) start again after a backoff that doubles up to watchBackoffMax.
func (b *Backend) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	out := make(chan lockbackend.Record, 1)
	send := func(rec lockbackend.Record) bool {
		select {
		case out <- rec:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		defer close(out)
		var next int64
		var bo backoff
		for ctx.Err() == nil {
			opts := []clientv3.OpOption{}
			if next > 0 {
				opts = append(opts, clientv3.WithRev(next))
			}
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			compacted := false
			for resp := range b.cli.Watch(wctx, b.recordKey(resource), opts...) {
				if resp.CompactRevision != 0 {
					compacted = true
					if b.ResumeCompactedUnread {
						next = resp.CompactRevision
					}
					break
				}
				if resp.Err() != nil {
					break
				}
				bo.reset()
				for _, ev := range resp.Events {
					next = ev.Kv.ModRevision + 1
					if ev.Type != clientv3.EventTypePut {
						continue
					}
					rec, ok := parseRecord(ev.Kv.Value)
					if !ok {
						continue
					}
					if !send(rec) {
						cancel()
						return
					}
				}
			}
			cancel()
			if compacted && !b.ResumeCompactedUnread {
				// The events since next are gone: what stands now is
				// what an observer must hear, and the watch goes on
				// after this read.
				rev, rec, err := b.readRecordAt(ctx, resource)
				if err == nil {
					next = rev + 1
					if rec != nil && !send(*rec) {
						return
					}
					continue
				}
			}
			if !bo.wait(ctx) {
				return
			}
		}
	}()
	return out
}

// readRecordAt reads resource's record as ReadRecord does, and the
// revision of the read: the record is nil when none of the holding
// grant's stands.
func (b *Backend) readRecordAt(ctx context.Context, resource string) (int64, *lockbackend.Record, error) {
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.holders(resource), clientv3.WithFirstCreate()...),
		clientv3.OpGet(b.recordKey(resource))).Commit()
	if err != nil {
		return 0, nil, err
	}
	h, r := kvOf(resp.Responses[0]), kvOf(resp.Responses[1])
	if h == nil || r == nil {
		return resp.Header.Revision, nil, nil
	}
	rec, ok := parseRecord(r.Value)
	tok, err := token(h.CreateRevision)
	if !ok || err != nil || rec.Token != tok {
		return resp.Header.Revision, nil, nil
	}
	return resp.Header.Revision, &rec, nil
}

// watchBackoffMin and watchBackoffMax bound the pause before a watch that
// failed starts again: a member with no leader refuses every watch at
// once, and without a pause a watcher would open thousands a second.
const (
	watchBackoffMin = 50 * time.Millisecond
	watchBackoffMax = 2 * time.Second
)

// backoff is the pause before a failed watch starts again: doubled at
// each failure in a row, back to the least once a watch works.
type backoff struct{ d time.Duration }

func (b *backoff) reset() { b.d = 0 }

// wait pauses, and reports false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	b.d = min(max(2*b.d, watchBackoffMin), watchBackoffMax)
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
