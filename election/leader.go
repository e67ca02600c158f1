package election

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
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
	keys := []string{e.lockKey, e.recordKey}
	replies := e.fanOut(ctx, func(ctx context.Context, c redis.UniversalClient) (any, error) {
		return leaderScript.Run(ctx, c, keys).Slice()
	})
	type term struct {
		token  fence.Token
		holder string
	}
	votes := map[term]int{}
	values := map[term]string{}
	answered := 0
	var errs []error
	for _, r := range replies {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		answered++
		rec, _ := r.val.([]any)
		if len(rec) != 3 {
			continue
		}
		v, _ := rec[0].(string)
		ts, _ := rec[1].(string)
		h, _ := rec[2].(string)
		n, err := strconv.ParseUint(ts, 10, 64)
		if err != nil {
			continue
		}
		k := term{fence.Token(n), h}
		votes[k]++
		values[k] = v
	}
	var best Leader
	for k, n := range votes {
		if n >= e.quorum && k.token > best.Token {
			best = Leader{Value: values[k], Token: k.token}
		}
	}
	switch {
	case best.Token > 0:
		return best, nil
	case answered < e.quorum:
		return Leader{}, fmt.Errorf("election: Leader %q: %w", e.name, errors.Join(errs...))
	}
	return Leader{}, ErrNoLeader
}

// Observe reports each new leader of the election, in order, with
// increasing tokens, until ctx ends; then the channel is closed. It never
// reports a term older than one it has reported, and reports the current
// leader, if any, first.
//
// New leaders are announced on the election's channel ([Election.Channel])
// by the script that records them, so an observer hears of every term,
// however short, while its subscription is up; it also reads the leader
// every third of the TTL (at most every second), which finds the current
// leader after the subscription was down (a Redis restart or failover, a
// cut connection). A term that began and ended while the subscription was
// down and between two reads is the one an observer can miss. Tokens of
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
	msgs := make(chan *redis.Message, 64)
	for _, n := range e.nodes {
		c := n.Client
		var ps *redis.PubSub
		if e.sharded == "1" {
			ps = c.SSubscribe(ctx, e.channel)
		} else {
			ps = c.Subscribe(ctx, e.channel)
		}
		defer ps.Close()
		ch := ps.Channel()
		go func() {
			for m := range ch {
				select {
				case msgs <- m:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	every := min(max(e.ttl/3, 10*time.Millisecond), time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last fence.Token
	report := func(l Leader) bool {
		if l.Token <= last {
			return true
		}
		select {
		case out <- l:
			last = l.Token
			return true
		case <-ctx.Done():
			return false
		}
	}
	var poll func() bool
	// announced reports a message's leader; with several nodes, where one
	// node's announcement is not yet a quorum's, it reads the leader instead.
	announced := func(m *redis.Message) bool {
		if e.quorum > 1 {
			return poll()
		}
		tok, value, ok := strings.Cut(m.Payload, " ")
		n, err := strconv.ParseUint(tok, 10, 64)
		if !ok || err != nil {
			return true
		}
		return report(Leader{Value: value, Token: fence.Token(n)})
	}
	poll = func() bool {
		rctx, cancel := context.WithTimeout(ctx, every)
		l, err := e.Leader(rctx)
		cancel()
		if err != nil {
			return ctx.Err() == nil
		}
		// Announcements already received are of earlier terms than the
		// one just read: report them first, so none is skipped.
		for {
			select {
			case m := <-msgs:
				if e.quorum == 1 && !announced(m) {
					return false
				}
				continue
			default:
			}
			break
		}
		return report(l)
	}
	if !poll() {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-msgs:
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
