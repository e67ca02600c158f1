package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The record beside a Redlock lock: the single-node record (record.go) on
// every node, each call fanned out in parallel and bounded by the node
// timeout; a write, a refresh or a read counts only when a quorum agrees.

// PutRecord writes f's record on every node; it is f's once a quorum
// names it.
func (r *redlock) PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error {
	lk, rk, ch := recordNames(r.prefix, f.Resource)
	tok := strconv.FormatUint(uint64(f.Token), 10)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (any, error) {
		sharded := ""
		if n.publish == "s" {
			sharded = "1"
		}
		return recordPutScript.Run(ctx, n.client, []string{lk, rk}, f.Holder, tok, value, linger.Milliseconds(), ch, sharded).Result()
	}, nil)
	ok, held := 0, 0
	var above fence.Token
	var errs []error
	for i, rep := range replies {
		if rep.err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", i, rep.err))
			continue
		}
		good, newer, err := putReply(rep.v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("node %d: %w", i, err))
		case newer > 0:
			above = max(above, newer)
		case good:
			ok++
		default:
			held++
		}
	}
	switch {
	case ok >= r.quorum:
		return nil
	case above > 0:
		return &lockbackend.NewerRecordError{Resource: f.Resource, Token: above}
	case len(errs) == 0 || ok+held >= r.quorum:
		return ErrNotHeld
	}
	return quorumFailure(ctx, &QuorumFailure{Op: "record", Resource: f.Resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Err: joinNodes(errs)})
}

// KeepRecord refreshes f's record on every node; it fails only when a
// quorum no longer holds f's lock or record (a node that did not answer
// may still).
func (r *redlock) KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error {
	lk, rk, _ := recordNames(r.prefix, f.Resource)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		return recordKeepScript.Run(ctx, n.client, []string{lk, rk}, f.Holder, linger.Milliseconds()).Int64()
	}, nil)
	_, gone, _ := count(replies, func(n int64) bool { return n == 1 })
	if gone > len(replies)-r.quorum {
		return ErrNotHeld
	}
	return nil
}

// ReadRecord reads the record on every node and returns the newest one a
// quorum names (with the same holder, so a quorum holds its lock).
func (r *redlock) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	lk, rk, _ := recordNames(r.prefix, resource)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (any, error) {
		return recordReadScript.Run(ctx, n.client, []string{lk, rk}).Result()
	}, nil)
	type term struct {
		token  fence.Token
		holder string
	}
	votes := map[term]int{}
	values := map[term]lockbackend.Record{} // the node's record with the highest Seq
	answered := 0
	var errs []error
	for i, rep := range replies {
		if rep.err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", i, rep.err))
			continue
		}
		answered++
		rec, holder, ok := readReply(rep.v)
		if !ok {
			continue
		}
		k := term{rec.Token, holder}
		votes[k]++
		if was, seen := values[k]; !seen || rec.Seq >= was.Seq {
			values[k] = rec
		}
	}
	var best lockbackend.Record
	for k, n := range votes {
		if n >= r.quorum && k.token > best.Token {
			best = values[k]
		}
	}
	switch {
	case best.Token > 0:
		return best, nil
	case answered < r.quorum:
		return lockbackend.Record{}, fmt.Errorf("lock: read record %q: %w", resource, errors.Join(errs...))
	}
	return lockbackend.Record{}, lockbackend.ErrNoRecord
}

// ProclaimRecord changes f's record on every node; it holds the value once
// a quorum does. A change that failed may have been made on some nodes,
// which a read of those nodes can report.
func (r *redlock) ProclaimRecord(ctx context.Context, f fence.Fence, value string) error {
	lk, rk, ch := recordNames(r.prefix, f.Resource)
	tok := strconv.FormatUint(uint64(f.Token), 10)
	replies := fanOut(ctx, r, nil, func(ctx context.Context, n redlockNode) (int64, error) {
		sharded := ""
		if n.publish == "s" {
			sharded = "1"
		}
		return recordProclaimScript.Run(ctx, n.client, []string{lk, rk}, f.Holder, tok, value, ch, sharded).Int64()
	}, nil)
	ok, gone, errs := count(replies, func(n int64) bool { return n == 1 })
	switch {
	case ok >= r.quorum:
		return nil
	case gone > len(replies)-r.quorum:
		return ErrNotHeld
	}
	return quorumFailure(ctx, &QuorumFailure{Op: "proclaim", Resource: f.Resource, Nodes: len(replies), Quorum: r.quorum,
		OK: ok, Err: errs})
}

// WatchRecord hears every node's announcements; each is a zero Record,
// since one node's is not a quorum's: the watcher reads the record.
func (r *redlock) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	_, _, ch := recordNames(r.prefix, resource)
	clients := make([]Client, len(r.nodes))
	for i, n := range r.nodes {
		clients[i] = n.client
	}
	return watchRecords(ctx, clients, ch)
}

var _ interface {
	lockbackend.Recorder
	lockbackend.Proclaimer
} = (*redlock)(nil)
