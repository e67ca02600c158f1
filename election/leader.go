package election

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// Leader is who leads an election: the value its term was won with and the
// term's token. Tokens of later terms are higher. The holder id of the
// term's fence is not part of it: it is what releases the lock, so only the
// leader has it.
type Leader struct {
	Value string
	Token fence.Token
}

// Leader returns the current leader, or [ErrNoLeader] when nobody leads:
// no term was won yet, the last term ended, or the lock was just handed to
// a candidate that has not recorded itself yet. The answer is the leader
// record of the term that holds the lock at the moment of the read, in one
// round trip (on each node, for a Locker made by [lock.NewRedlock], where a
// quorum must agree). ctx bounds the call.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := checkCtx("Leader", ctx); err != nil {
		return Leader{}, err
	}
	l, _, err := e.leader(ctx)
	return l, err
}

// leader is Leader, with how many values the term has proclaimed (the
// record's Seq), by which Observe orders a term's values.
func (e *Election) leader(ctx context.Context) (Leader, uint64, error) {
	rec, err := e.rec.ReadRecord(ctx, e.name)
	switch {
	case errors.Is(err, lockbackend.ErrNoRecord):
		return Leader{}, 0, ErrNoLeader
	case err != nil:
		return Leader{}, 0, fmt.Errorf("election: Leader %q: %w", e.name, err)
	}
	return Leader{Value: rec.Value, Token: rec.Token}, rec.Seq, nil
}

// Observe reports each new leader of the election, in order, with
// increasing tokens, and each value a leader proclaims ([Term.Proclaim],
// with its term's token), until ctx ends; then the channel is closed. It
// never reports a term older than one it has reported, nor a term's value
// older than one it has reported, and reports the current leader, if any,
// first.
//
// New leaders are announced on the election's channel ([RedisNames.Channel])
// by the script that records them, so an observer hears of every term,
// however short, while its subscription is up; it also reads the leader
// every third of the TTL (at most every second), which finds the current
// leader after the subscription was down (a Redis restart or failover, a
// cut connection). A term that began and ended while the subscription was
// down and between two reads is the one an observer can miss (and so is a
// value proclaimed and replaced in such a while); what it reports is still
// in order. Tokens of
// terms won after Redis lost its data are still higher (they are anchored
// to the server's clock; see package lock), so observers go on across it.
//
// Read the channel promptly: Observe waits for each send. ctx must not be
// nil.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader)
	if ctx == nil {
		close(out)
		return out
	}
	go e.observe(ctx, out)
	return out
}

func (e *Election) observe(ctx context.Context, out chan<- Leader) {
	defer close(out)
	// New leaders are announced as they are recorded; a backend whose
	// single announcement cannot vouch for a quorum (Redlock) sends a zero
	// Record instead, and the leader is read.
	msgs := e.rec.WatchRecord(ctx, e.name)
	every := min(max(e.ttl/3, 10*time.Millisecond), time.Second)
	if e.readEvery > 0 {
		every = e.readEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	// The last report: a term's token, then how many values it had
	// proclaimed (see proclaim.lua), order what is news.
	var last Leader
	var lastSeq uint64
	report := func(l Leader, seq uint64) bool {
		switch {
		case l.Token < last.Token:
			return true
		case l.Token == last.Token:
			if seq <= lastSeq {
				return true
			}
			lastSeq = seq
			if l.Value == last.Value {
				return true // the value read again, not a new one
			}
		default:
			lastSeq = seq
		}
		select {
		case out <- l:
			last = l
			return true
		case <-ctx.Done():
			return false
		}
	}
	var poll func() bool
	// announced reports a message's leader; with several nodes, where one
	// node's announcement is not yet a quorum's, it reads the leader instead.
	announced := func(m lockbackend.Record) bool {
		if m.Token == 0 {
			return poll()
		}
		return report(Leader{Value: m.Value, Token: m.Token}, m.Seq)
	}
	poll = func() bool {
		for {
			rctx, cancel := context.WithTimeout(ctx, every)
			l, seq, err := e.leader(rctx)
			cancel()
			if err != nil {
				return ctx.Err() == nil
			}
			// Announcements received meanwhile that carry their record
			// are reported first, so none is skipped (the read's leader is
			// then passed over if one of them is newer). One without its
			// record may be of a write made after the read: read again once
			// this one is reported, rather than wait for the next tick.
			again := false
		drain:
			for {
				select {
				case m, ok := <-msgs:
					switch {
					case !ok:
						break drain
					case m.Token == 0:
						again = true
					case !announced(m):
						return false
					}
				default:
					break drain
				}
			}
			if !report(l, seq) {
				return false
			}
			if !again {
				return true
			}
		}
	}
	if !poll() {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				msgs = nil // closed as ctx ended
				continue
			}
			if !announced(m) {
				return
			}
		case <-tick.C:
			if !poll() {
				return
			}
		}
	}
}
