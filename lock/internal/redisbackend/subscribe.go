package redisbackend

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The subscription multiplexer: a Locker's waiters share its subscription
// connections (one, one per hash slot on a cluster with sharded pub/sub, or
// one per resource on a Ring). A channel is subscribed when its first waiter
// arrives and unsubscribed topicLinger after its last one leaves. Each
// connection has a writer goroutine (subscribe, unsubscribe, health pings)
// and a reader goroutine (messages, confirmations); a connection that
// breaks is replaced by a new generation, and its waiters are told to retry
// on the Locker's wait strategy meanwhile. Waiting itself is in wait.go,
// the queue protocol's messages in queue.go.

const (
	// healthEvery is how long a silent subscription connection waits before
	// it pings the server; a ping unanswered for as long again means the
	// connection is dead and is replaced.
	healthEvery = time.Second
	// idleLinger is how long a connection with no subscribed channel stays
	// open for the next waiter.
	idleLinger = 30 * time.Second
	// subWriteTimeout bounds one subscribe or unsubscribe write.
	subWriteTimeout = 5 * time.Second
	// topicLinger is how long a channel stays subscribed after its last
	// waiter here left, so that the next Acquire of the resource in this
	// process is covered from its first try (which then queues) instead of
	// paying a subscribe and a second try. At most maxLingering channels
	// per connection linger; past that a channel is dropped at once.
	topicLinger  = 2 * time.Second
	maxLingering = 1024
)

type subMode int

const (
	subPlain      subMode = iota // SUBSCRIBE, one connection
	subSharded                   // SSUBSCRIBE, one connection per hash slot
	subPerChannel                // SUBSCRIBE, one connection per channel
)

// hub is a Locker's set of subscription connections.
type hub struct {
	client Client
	mode   subMode
	wg     sync.WaitGroup // every connection's goroutines

	mu     sync.Mutex // guards everything below and all subConn, topic and waiter state
	closed bool
	conns  map[string]*subConn
}

func newHub(client Client) *hub {
	h := &hub{client: client, conns: make(map[string]*subConn)}
	switch {
	case client.Sharded():
		h.mode = subSharded
	case client.PerChannel():
		// A Ring routes a connection by its first channel: keep one channel
		// per connection so every subscription reaches its shard.
		h.mode = subPerChannel
	}
	return h
}

func (h *hub) connKey(channel string) string {
	switch h.mode {
	case subSharded:
		return strconv.Itoa(int(keySlot(hashed(channel))))
	case subPerChannel:
		return channel
	}
	return ""
}

// subConn is one subscription connection: a reader goroutine that receives
// confirmations and messages and keeps the connection healthy, and a writer
// goroutine that sends subscribe and unsubscribe commands in the order they
// were decided.
type subConn struct {
	h         *hub
	key       string
	gen       *psGen
	topics    map[string]*topic
	pending   map[string]int // subscribes sent on gen, not yet confirmed
	unsubs    map[string]int // unsubscribes sent on gen, not yet confirmed
	ops       []subOp
	kick      chan struct{} // cap 1: ops are waiting
	quit      chan struct{} // closed to stop both goroutines
	retired   bool
	idleSince time.Time
	lingering int       // topics without waiters, kept subscribed for topicLinger
	swept     time.Time // when lingering topics were last looked at
}

// psGen is one PubSub; it is replaced, never reused, after a failure.
type psGen struct {
	ps      PubSub
	once    sync.Once
	written chan struct{} // closed after the first command was written
}

// close closes the generation's PubSub.
func (g *psGen) close() { _ = g.ps.Close() }

type subOp struct {
	gen     *psGen
	sub     bool
	channel string
}

type topic struct {
	channel string
	c       *subConn
	ready   chan struct{} // closed when the subscription is confirmed
	lost    chan struct{} // closed when a confirmed subscription is lost
	isReady bool
	waiters []*waiter
	idle    time.Time // when its last waiter left, while it lingers; zero otherwise
}

type waiter struct {
	t      *topic
	holder string                    // the holder id it queues under
	wake   chan struct{}             // cap 1
	grant  chan lockbackend.HandOver // cap 1: a release granted it the lock
	place  chan lockbackend.Place    // cap 1, the latest only: it is among the first of the queue
	owes   bool                      // took a wake-up and has not yet tried on it
}

func newGen(ps PubSub) *psGen {
	return &psGen{ps: ps, written: make(chan struct{})}
}

func (t *topic) setReady() {
	if !t.isReady {
		t.isReady = true
		close(t.ready)
	}
}

func (t *topic) setLost() {
	if t.isReady {
		close(t.lost)
		t.ready, t.lost, t.isReady = make(chan struct{}), make(chan struct{}), false
	}
}

// wakeOne wakes the first waiter that has no wake-up pending.
func (t *topic) wakeOne() {
	for _, w := range t.waiters {
		select {
		case w.wake <- struct{}{}:
			return
		default:
		}
	}
}

// deliver passes grant g to the waiter queued as holder, if it is here.
func (t *topic) deliver(holder string, g grantMsg) {
	for _, w := range t.waiters {
		if w.holder == holder {
			select {
			case w.grant <- lockbackend.HandOver{Token: fence.Token(g.token), Ref: g.ref, Age: g.age}:
			default:
			}
			return
		}
	}
}

// place tells the waiters named first in the queue (by holder, head first)
// their place and the lease's remaining time rem, replacing what they have
// not read yet of an earlier announcement; the caller holds h.mu, so no
// other send comes between the drain and the send.
//
// An announcement of a lease that runs for a queue refresh or longer (every
// hand-over of a lease of a second or more), or that has no expiry, only
// drains what the waiters have not read: each waiter refreshes its entry
// within lockbackend.QueueRefresh and that refresh's reply tells it the same,
// so the announcement could not move its next try earlier, and waking it
// would take the processor from the waiter that the same release has just
// granted the lock.
func (t *topic) place(first []string, rem time.Duration, at time.Time) {
	tell := rem < lockbackend.QueueRefresh && rem != lockbackend.NoExpiry
	for _, w := range t.waiters {
		for i, h := range first {
			if w.holder != h {
				continue
			}
			select {
			case <-w.place:
			default:
			}
			if tell {
				w.place <- lockbackend.Place{Place: i, Remaining: rem, At: at}
			}
		}
	}
}

// join registers a waiter for holder on channel. With create false it only
// joins a channel that already has waiters here, which costs no I/O; it
// returns nil otherwise, and always after the hub was closed.
func (h *hub) join(channel string, create bool, holder string) *waiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	key := h.connKey(channel)
	c := h.conns[key]
	if c == nil && !create {
		return nil
	}
	if c == nil {
		c = &subConn{
			h: h, key: key, gen: newGen(h.client.NewPubSub()),
			topics: make(map[string]*topic), pending: make(map[string]int), unsubs: make(map[string]int),
			kick: make(chan struct{}, 1), quit: make(chan struct{}),
		}
		h.conns[key] = c
		h.wg.Add(2)
		go c.reader()
		go c.writer()
	}
	t := c.topics[channel]
	if t == nil && !create {
		return nil
	}
	if t == nil {
		t = &topic{channel: channel, c: c, ready: make(chan struct{}), lost: make(chan struct{})}
		c.topics[channel] = t
		c.pending[channel]++
		c.enqueue(subOp{gen: c.gen, sub: true, channel: channel})
	}
	if !t.idle.IsZero() {
		t.idle = time.Time{}
		c.lingering--
	}
	w := &waiter{t: t, holder: holder, wake: make(chan struct{}, 1), grant: make(chan lockbackend.HandOver, 1), place: make(chan lockbackend.Place, 1)}
	t.waiters = append(t.waiters, w)
	return w
}

// state returns the waiter's subscription as of now: whether it is
// confirmed, the channel that closes once it is, and the one that closes
// if it is lost after that.
func (w *waiter) state() (ready, lost <-chan struct{}, confirmed bool) {
	h := w.t.c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return w.t.ready, w.t.lost, w.t.isReady
}

// leave removes the waiter. One that leaves without the lock hands on a
// wake-up it took or was sent, so that another waiter tries in its place.
func (h *hub) leave(w *waiter, acquired bool) {
	if w == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := w.t
	for i, x := range t.waiters {
		if x == w {
			t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
			break
		}
	}
	if !acquired && (w.owes || len(w.wake) > 0) {
		t.wakeOne()
	}
	if len(t.waiters) > 0 {
		return
	}
	c := t.c
	if c.topics[t.channel] != t {
		return
	}
	if c.retired || c.lingering >= maxLingering {
		c.drop(t)
		return
	}
	t.idle = time.Now()
	c.lingering++
}

// drop unsubscribes t, which has no waiter; the caller holds h.mu.
func (c *subConn) drop(t *topic) {
	delete(c.topics, t.channel)
	if !t.idle.IsZero() {
		t.idle = time.Time{}
		c.lingering--
	}
	if !c.retired {
		c.unsubs[t.channel]++
		c.enqueue(subOp{gen: c.gen, channel: t.channel})
	}
	if len(c.topics) == 0 {
		c.idleSince = time.Now()
	}
}

// sweep drops the topics that have lingered for topicLinger, at most once
// per healthEvery.
func (c *subConn) sweep() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	now := time.Now()
	if c.lingering == 0 || now.Sub(c.swept) < healthEvery {
		return
	}
	c.swept = now
	for _, t := range c.topics {
		if !t.idle.IsZero() && now.Sub(t.idle) >= topicLinger {
			c.drop(t)
		}
	}
}

// close stops every connection and waits for their goroutines until
// deadline. Waiters still waiting fall back to timed retries.
//
// A PubSub being connected again (its dial and handshake, which a client
// may bound by its read timeout only) holds its lock, which its Close needs
// too, and holds our reader and writer on it: so each PubSub is closed
// from a goroutine of its own, and what has not ended by deadline ends
// when go-redis gives up on the connection.
func (h *hub) close(deadline time.Time) {
	h.mu.Lock()
	h.closed = true
	var gens []*psGen
	for key, c := range h.conns {
		delete(h.conns, key)
		gens = append(gens, c.retire())
	}
	h.mu.Unlock()
	for _, g := range gens {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			g.close()
		}()
	}
	lockbackend.WaitUntil(&h.wg, deadline)
}

// retire takes c out of service; the caller holds h.mu and closes the
// returned PubSub after unlocking.
func (c *subConn) retire() *psGen {
	if c.retired {
		return c.gen
	}
	c.retired = true
	close(c.quit)
	for _, t := range c.topics {
		t.setLost()
	}
	if c.h.conns[c.key] == c {
		delete(c.h.conns, c.key)
	}
	return c.gen
}

func (c *subConn) enqueue(op subOp) {
	c.ops = append(c.ops, op)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *subConn) writer() {
	defer c.h.wg.Done()
	for {
		select {
		case <-c.quit:
			return
		case <-c.kick:
		}
		for {
			c.h.mu.Lock()
			if len(c.ops) == 0 || c.retired {
				c.h.mu.Unlock()
				break
			}
			op := c.ops[0]
			c.ops = c.ops[1:]
			c.h.mu.Unlock()
			c.write(op)
		}
	}
}

// write sends one command. A failure needs no handling here: the reader sees
// the broken connection and subscribes every channel again on a new one.
func (c *subConn) write(op subOp) {
	ctx, cancel := context.WithTimeout(context.Background(), subWriteTimeout)
	defer cancel()
	if op.sub {
		_ = op.gen.ps.Subscribe(ctx, op.channel)
	} else {
		_ = op.gen.ps.Unsubscribe(ctx, op.channel)
	}
	op.gen.once.Do(func() { close(op.gen.written) })
}

func (c *subConn) reader() {
	defer c.h.wg.Done()
	failures := 0
	for {
		c.h.mu.Lock()
		g := c.gen
		c.h.mu.Unlock()
		// Receiving before the first command would connect a PubSub that
		// has no channel yet, which a cluster client routes to a random node.
		select {
		case <-c.quit:
			return
		case <-g.written:
		}
		if c.receive(g, &failures) {
			return
		}
		failures++
		if !c.reset(failures) {
			return
		}
	}
}

// receive handles what g's connection delivers until it breaks (false) or
// the connection is retired (true).
func (c *subConn) receive(g *psGen, failures *int) (retired bool) {
	ps := g.ps
	pinged := false
	for {
		ev, err := ps.Receive(healthEvery)
		select {
		case <-c.quit:
			return true
		default:
		}
		c.sweep()
		switch {
		case err == nil && ev.Kind != EventNone:
			pinged, *failures = false, 0
			if c.handle(ev) {
				return false
			}
		case err == nil:
			if c.retireIfIdle() {
				return true
			}
			if pinged {
				return false // nothing, not even a pong, for a whole interval
			}
			pinged = true
			ctx, cancel := context.WithTimeout(context.Background(), healthEvery)
			err := ps.Ping(ctx)
			cancel()
			if err != nil {
				return false
			}
		default:
			return false
		}
	}
}

// handle applies one received message; it reports whether the connection
// must be replaced (the server dropped a subscription on its own, as a
// cluster does when the channel's slot moves).
func (c *subConn) handle(m Event) (broken bool) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	switch m.Kind {
	case EventSubscribe:
		ch := m.Channel
		if c.pending[ch] > 0 {
			c.pending[ch]--
		}
		if c.pending[ch] == 0 {
			delete(c.pending, ch)
			if t := c.topics[ch]; t != nil && c.unsubs[ch] == 0 {
				t.setReady()
			}
		}
	case EventUnsubscribe:
		ch := m.Channel
		if c.unsubs[ch] > 0 {
			if c.unsubs[ch]--; c.unsubs[ch] == 0 {
				delete(c.unsubs, ch)
			}
		} else if c.topics[ch] != nil {
			return true
		}
	case EventMessage:
		t := c.topics[m.Channel]
		if t == nil {
			break
		}
		if rem, first, ok := parsePlaces(m.Payload); ok {
			t.place(first, rem, time.Now())
			break
		}
		holder, g, ok := parseGrant(m.Payload)
		if !ok {
			t.wakeOne() // free: one waiter tries
			break
		}
		t.deliver(holder, g) // a grant to another process's waiter is no one's here
	}
	return false
}

func (c *subConn) retireIfIdle() bool {
	c.h.mu.Lock()
	if len(c.topics) > 0 || time.Since(c.idleSince) < idleLinger {
		c.h.mu.Unlock()
		return false
	}
	g := c.retire()
	c.h.mu.Unlock()
	g.close()
	return true
}

// reset replaces a broken connection: waiters fall back to timed retries at
// once, and after a pause that grows with consecutive failures every
// channel is subscribed again on a new connection. It returns false when
// the connection was retired instead.
func (c *subConn) reset(failures int) bool {
	c.h.mu.Lock()
	for _, t := range c.topics {
		t.setLost()
	}
	old := c.gen
	c.h.mu.Unlock()
	old.close()

	pause := min(10*time.Millisecond<<min(failures-1, 7), time.Second)
	timer := time.NewTimer(pause)
	defer timer.Stop()
	select {
	case <-c.quit:
		return false
	case <-timer.C:
	}

	c.h.mu.Lock()
	if c.retired {
		c.h.mu.Unlock()
		return false
	}
	for ch, t := range c.topics {
		if !t.idle.IsZero() { // lingering: not worth subscribing again
			delete(c.topics, ch)
			c.lingering--
		}
	}
	if len(c.topics) == 0 {
		g := c.retire()
		c.h.mu.Unlock()
		g.close()
		return false
	}
	c.gen = newGen(c.h.client.NewPubSub())
	c.pending, c.unsubs, c.ops = make(map[string]int), make(map[string]int), nil
	for ch := range c.topics {
		c.pending[ch] = 1
		c.enqueue(subOp{gen: c.gen, sub: true, channel: ch})
	}
	c.h.mu.Unlock()
	return true
}
