package lock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// The model's queue-order check: what the actors' clients saw of each
// waiter's queue entry, and the judgment of every grant against every
// waiter that was live and ahead of it.

// queueTry is one try that the server answered with a queued refusal: the
// waiter's entry was made, or refreshed, between sent and reply.
type queueTry struct {
	sent, reply time.Time
}

// queued is what the actors' clients saw of one waiter's queue entry.
type queued struct {
	tries []queueTry // in the order they were sent
	// waiting is the latest deadline a try of its Acquire was sent under:
	// until then the waiter neither gave up nor began to leave the queue.
	// Zero when a try had no deadline (then it is not judged).
	waiting time.Time
}

// queueHook records, from an actor's client, every acquire.lua call that
// joins the queue (it names a queue entry's life) and reads its reply by
// shape. A reply of no known shape is counted as unparsed.
type queueHook struct{ m *model }

func (h queueHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h queueHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h queueHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		call, ok := parseScriptCall(cmd.Args())
		// ARGV[5], the entry's life, is given by a caller that queues.
		queues := ok && call.name == "acquire" && len(call.argv) >= 5 && call.argv[4] != ""
		sent := time.Now()
		err := next(ctx, cmd)
		if ok && call.name == "try" && len(call.argv) > 0 {
			h.m.gmu.Lock()
			h.m.trySent[call.argv[0]] = sent
			h.m.tryReplied[call.argv[0]] = time.Now()
			h.m.gmu.Unlock()
		}
		if ok && call.name == "try" && len(call.keys) == 3 && err == nil {
			// {4}: the lock was free with waiters queued, the state in
			// which the fast path's queue check decides (the call goes on
			// to acquire.lua, which hands the lock to the first live one).
			if c, isCmd := cmd.(*redis.Cmd); isCmd {
				if res, _ := c.Val().([]any); len(res) == 1 && res[0] == int64(4) {
					h.m.count("free-lock tries: waiters queued", 1)
					if h.m.waiterAhead(call.argv[0], sent) {
						h.m.count("free-lock tries: a live waiter ahead", 1)
						// The fast path (try_fast.lua) grants only over
						// token state in its short form, "<n> <h>", that a
						// try wrote: only then does its own queue check
						// stand between the try and the waiter.
						if v, err := h.m.nodes[0].c.Get(ctx, call.keys[1]).Result(); err == nil && fastPathState(v, sent) {
							h.m.count("free-lock tries: a live waiter ahead, on the fast path", 1)
						}
					}
				}
			}
		}
		if ok && call.name == "acquire" && err == nil && !queues {
			// An Owner's call that re-entered a grant: the lease it gets is
			// that grant's, not a grant of its own.
			if c, isCmd := cmd.(*redis.Cmd); isCmd {
				if r, ok := parseAcquireReply(c.Val()); ok && r.shape == shapeReentered {
					h.m.gmu.Lock()
					h.m.reentered[r.holder] = true
					h.m.gmu.Unlock()
				}
			}
		}
		if !queues || err != nil {
			return err
		}
		reply := time.Now()
		c, isCmd := cmd.(*redis.Cmd)
		if !isCmd {
			return err
		}
		r, ok := parseAcquireReply(c.Val())
		if !ok {
			h.m.count("unparsed: queued tries' replies", 1)
			h.m.note("a queued try's reply of no known shape: %v", c.Val())
			return err
		}
		h.m.count("queued tries' replies: "+r.shape, 1)
		holder := call.argv[0]
		switch r.shape {
		case shapeQueued:
			deadline, _ := ctx.Deadline()
			h.m.gmu.Lock()
			q := h.m.queue[holder]
			if q == nil {
				q = &queued{}
				h.m.queue[holder] = q
			}
			q.tries = append(q.tries, queueTry{sent: sent, reply: reply})
			if deadline.After(q.waiting) {
				q.waiting = deadline
			}
			h.m.gmu.Unlock()
		case shapeReentered:
			h.m.gmu.Lock()
			h.m.reentered[r.holder] = true
			h.m.gmu.Unlock()
		case shapeHandedOver, shapeGranted:
			if r.token > 0 {
				h.m.gmu.Lock()
				if old, ok := h.m.served[holder]; !ok || fence.Token(r.token) < old {
					h.m.served[holder] = fence.Token(r.token)
				}
				h.m.gmu.Unlock()
			}
		}
		return err
	}
}

// queueMargin is how far short of its life a waiter's entry is taken as
// live, for the clocks' reading between the client and the server.
const queueMargin = 10 * time.Millisecond

// liveAhead reports whether q's entry was in the queue, unbroken, from
// before start until at least end: made by a try answered before start,
// refreshed from then on before each refresh's life ran out, its last
// refresh before start still live at end, and its waiter still waiting
// at end.
func (q *queued) liveAhead(start, end time.Time) bool {
	if q.waiting.IsZero() || !end.Before(q.waiting) {
		return false
	}
	j := -1
	for i, t := range q.tries {
		if t.reply.Before(start) {
			j = i
		}
	}
	if j < 0 || end.Sub(q.tries[j].sent) >= modelQueueLife-queueMargin {
		return false
	}
	// Tries 0..j were sent in order; the entry is unbroken since try 0 if
	// each refresh came before the one before it ran out. A break only
	// moves the entry's place later, past start at worst: then it is not
	// known to be ahead.
	for i := j; i > 0; i-- {
		if q.tries[i].reply.Sub(q.tries[i-1].sent) >= modelQueueLife-queueMargin {
			return false
		}
	}
	return true
}

// waiterAhead reports whether a waiter other than holder is provably in
// the queue ahead of a try sent at sent, and waiting now, by the same rule
// (liveAhead) that checkQueue judges with: the control counts as gone wrong
// only what the judge can see.
func (m *model) waiterAhead(holder string, sent time.Time) bool {
	now := time.Now()
	m.gmu.Lock()
	defer m.gmu.Unlock()
	for y, q := range m.queue {
		if y == holder || len(q.tries) == 0 {
			continue
		}
		tries := slices.Clone(q.tries)
		sort.Slice(tries, func(i, j int) bool { return tries[i].sent.Before(tries[j].sent) })
		if !(&queued{tries: tries, waiting: q.waiting}).liveAhead(sent, now) {
			continue
		}
		if _, served := m.served[y]; !served {
			return true
		}
	}
	return false
}

// checkQueue judges arrival order once the run is over: a waiter Y whose
// entry was live and ahead of grant X (queued before X was asked for, live
// and still waiting when X returned) must have been served before X. If
// it was served after X, or never, X jumped the queue.
func (m *model) checkQueue() {
	if m.chanGap.Load() {
		m.t.Log("model: the release channel's subscription broke; queue order not checked")
		m.count("queue checks skipped (the release channel broke)", 1)
		return
	}
	m.gmu.Lock()
	defer m.gmu.Unlock()
	waiters := make([]string, 0, len(m.queue))
	for y := range m.queue {
		waiters = append(waiters, y)
	}
	sort.Strings(waiters)
	for _, y := range waiters {
		q := m.queue[y]
		sort.Slice(q.tries, func(i, j int) bool { return q.tries[i].sent.Before(q.tries[j].sent) })
		ty, servedY := m.served[y]
		for _, x := range m.grants {
			start, end := x.start, x.end
			if t, ok := m.trySent[x.f.Holder]; ok && (x.kind == "try" || x.kind == "poll") && t.After(start) && t.Before(x.end) {
				start = t // the try's place is taken when its script is sent
				if r, ok := m.tryReplied[x.f.Holder]; ok && r.After(t) && r.Before(end) {
					end = r // and the grant is made before its reply
				}
			}
			if x.kind == "reentry" || x.f.Holder == y || !q.liveAhead(start, end) {
				continue
			}
			m.count("queue pairs judged", 1)
			if servedY && ty < x.f.Token {
				continue // served first
			}
			// DESIGN 4c: every try that can take a free lock respects the
			// queue, polling Acquire (WithWait) and TryAcquire included.
			kind := "queue"
			switch x.kind {
			case "poll":
				kind = "queue-poll"
			case "try":
				kind = "queue-try"
			}
			fate := "never served"
			if servedY {
				fate = fmt.Sprintf("served token %d", ty)
			}
			m.violation(kind, [2]string{y, x.f.Holder}, "waiter %s, queued %s and waiting until %s, %s; %s%s grant token %d (actor %d), asked for %s, returned %s",
				fence.HolderMark(y), q.tries[0].reply.Format("15:04:05.000"), q.waiting.Format("15:04:05.000"), fate,
				x.kind, x.opts, x.f.Token, x.actor, x.start.Format("15:04:05.000"), x.end.Format("15:04:05.000"))
		}
	}
}

// skipQueueHook is the queue control's broken Locker: a try that finds
// the lock free with waiters queued ({4} from try.lua) is sent again
// without the queue's key, as a try that ignores the queue would be, and
// takes the lock. Each grant it takes so counts as exposed.
type skipQueueHook struct{ m *model }

func (h skipQueueHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h skipQueueHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h skipQueueHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		call, ok := parseScriptCall(cmd.Args())
		c, isCmd := cmd.(*redis.Cmd)
		if err != nil || !ok || !isCmd || call.name != "try" || len(call.keys) != 3 {
			return err
		}
		if res, _ := c.Val().([]any); len(res) != 1 || res[0] != int64(4) {
			return err
		}
		args := cmd.Args()
		again := []any{args[0], args[1], 2, args[3], args[4]}
		again = append(again, args[6:]...)
		redo := redis.NewCmd(ctx, again...)
		if err := next(ctx, redo); err != nil {
			c.SetErr(err)
			return err
		}
		c.SetVal(redo.Val())
		_, granted := redo.Val().(string)
		if res, _ := redo.Val().([]any); len(res) >= 2 && res[0] == int64(1) {
			granted = true
		}
		if granted && h.m.waiterAhead(call.argv[0], sent) {
			h.m.gmu.Lock()
			h.m.jumped[call.argv[0]] = true // the grant jumped a waiter that was live, waiting and ahead of it
			h.m.gmu.Unlock()
		}
		return nil
	}
}

// shortTokenState is the token state's short form, which only a try
// writes and only the try's fast path grants over.
var shortTokenState = regexp.MustCompile(`^([0-9]+) [^ ]+$`)

// fastPathState reports whether token state v is one the fast path of a
// try sent at sent grants over: the short form, with a counter behind the
// clock (read on the local clock, which may be a little off the server's).
func fastPathState(v string, sent time.Time) bool {
	m := shortTokenState.FindStringSubmatch(v)
	if m == nil {
		return false
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	return err == nil && n < sent.UnixMicro()
}

// noPauseKey marks the context of an Acquire whose waiter pauseHook
// leaves alone.
type noPauseKey struct{}

// pauseHook pauses a queued waiter now and then just before one of its
// tries, as a scheduler or a collector pauses a process: the head of the
// queue then tries late at the lease's end, and the lock stays free for a
// while with a live waiter queued, the state in which every other try must
// leave the lock to that waiter (try_fast.lua's queue check).
type pauseHook struct {
	m   *model
	mu  *sync.Mutex
	rng *rand.Rand
}

func (h pauseHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h pauseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h pauseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		call, ok := parseScriptCall(cmd.Args())
		if !ok || call.name != "acquire" || len(call.argv) < 5 || call.argv[4] == "" {
			return next(ctx, cmd)
		}
		if ctx.Value(slowGrantKey{}) != nil || ctx.Value(noPauseKey{}) != nil {
			// A short-starting lease's renewal is judged from its grant's
			// reply: a pause before the send would start it shorter still,
			// or dead, and leave nothing to renew. Likewise for the other
			// self-renewing leases (noPauseKey).
			return next(ctx, cmd)
		}
		h.m.gmu.Lock()
		_, queued := h.m.queue[call.argv[0]]
		h.m.gmu.Unlock()
		if !queued {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		pause := h.rng.IntN(2) == 0
		d := time.Duration(30+h.rng.IntN(70)) * time.Millisecond
		h.mu.Unlock()
		if pause {
			h.m.count("waiters paused before a try", 1)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		return next(ctx, cmd)
	}
}
