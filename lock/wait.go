package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// Waiting for a release. A waiter whose subscription to the resource's
// channel is confirmed joins the resource's wait queue in Redis with the
// try that is refused, and the release that frees the lock grants it to
// the first live waiter in that queue in the same script, publishing the
// grant (holder, token) on the channel: the waiter has the lock when the
// message arrives, with no round trip of its own. A release that finds
// waiters queued but none live publishes an empty message, and each such
// message wakes one waiter of the Locker to try; with nobody queued there
// is no one to wake (a waiter that is not queued yet tries again once its
// subscription is confirmed), and nothing is published. A Locker's waiters share one subscription
// connection (one per hash slot on a cluster, where sharded pub/sub is
// used; one per resource on a Ring). A channel is subscribed when its first
// waiter arrives and unsubscribed topicLinger after its last one leaves, so
// that a later Acquire of the resource in this process is covered (and
// queues) from its first try.
//
// A waiter counts as registered only once the server has confirmed the
// subscription; only a try made after that is covered by the wake-up or
// queues the waiter, so neither a release nor a grant can slip between a
// refused try and the wait. A waiter that took a wake-up and leaves without
// the lock hands it on, so no wake-up is lost; one that leaves the queue
// takes its entry out, and gives back (hands on) a grant it got meanwhile.
// A queued waiter refreshes its entry every queueRefresh, by trying again,
// and an entry not refreshed for queueLife is skipped, so a waiter that
// vanished is passed over. Only the head of the queue (its last try says
// so) also tries when the current lease is due to end; any other try would
// find the lock handed to the head. Every try respects the queue, also one
// made before the subscription is confirmed: a free lock with live waiters
// queued ahead goes to the first of them. While the subscription is down, waiters retry on
// the Locker's wait strategy, never sleeping past the current lease's
// remaining time; a queued waiter's retry finds a grant made to it.

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
	// queueRefresh is how often a queued waiter refreshes its entry; an
	// entry not refreshed for queueLife is passed over. queueLife bounds how
	// long a waiter that vanished (a crashed process) can still be granted
	// the lock, which then stays taken until its lease runs out.
	queueRefresh = time.Second
	queueLife    = 3 * queueRefresh
	// topicLinger is how long a channel stays subscribed after its last
	// waiter here left, so that the next Acquire of the resource in this
	// process is covered from its first try (which then queues) instead of
	// paying a subscribe and a second try. At most maxLingering channels
	// per connection linger; past that a channel is dropped at once.
	topicLinger  = 2 * time.Second
	maxLingering = 1024
)

// queueLifeArg is queueLife as a script argument, converted once.
var queueLifeArg any = queueLife.Milliseconds()

type subMode int

const (
	subPlain      subMode = iota // SUBSCRIBE, one connection
	subSharded                   // SSUBSCRIBE, one connection per hash slot
	subPerChannel                // SUBSCRIBE, one connection per channel
)

// hub is a Locker's set of subscription connections.
type hub struct {
	client redis.UniversalClient
	mode   subMode
	wg     sync.WaitGroup // every connection's goroutines

	mu     sync.Mutex // guards everything below and all subConn, topic and waiter state
	closed bool
	conns  map[string]*subConn
}

func newHub(client redis.UniversalClient) *hub {
	h := &hub{client: client, conns: make(map[string]*subConn)}
	switch client.(type) {
	case *redis.ClusterClient:
		h.mode = subSharded
	case *redis.Ring:
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

// newPubSub returns a PubSub with no channel yet, so without any I/O; nil
// on a Ring, which routes a PubSub by its first channel and so can only
// make one that subscribes at once: the writer makes it then (see write).
func (h *hub) newPubSub() *redis.PubSub {
	switch c := h.client.(type) {
	case *redis.ClusterClient:
		return c.SSubscribe(context.Background())
	case *redis.Ring:
		return nil
	}
	return h.client.Subscribe(context.Background())
}

// ringSubscribe subscribes channel on a new PubSub of the Ring's shard for
// it, or returns nil when the Ring has no shard to give (it panics then,
// rather than return an error).
func (h *hub) ringSubscribe(ctx context.Context, channel string) (ps *redis.PubSub) {
	defer func() {
		if recover() != nil {
			ps = nil
		}
	}()
	return h.client.Subscribe(ctx, channel)
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
	// ps is set when the generation is made, or on a Ring by its first
	// subscribe; nil until then, and for good if that subscribe failed.
	ps      atomic.Pointer[redis.PubSub]
	once    sync.Once
	written chan struct{} // closed after the first command was written
}

// close closes the generation's PubSub, if it has one.
func (g *psGen) close() {
	if ps := g.ps.Load(); ps != nil {
		_ = ps.Close()
	}
}

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
	holder string        // the holder id it queues under
	wake   chan struct{} // cap 1
	grant  chan grantMsg // cap 1: a release granted it the lock
	moved  chan struct{} // cap 1: a release granted the lock to another waiter
	owes   bool          // took a wake-up and has not yet tried on it
}

// grantMsg is a release's grant to a queued waiter: the token, and the
// entry it was granted on (its last refresh, µs on the server clock) with
// how long before the grant that refresh was.
type grantMsg struct {
	token int64
	ref   int64
	age   time.Duration
}

// parseGrant reads a release message "<holder> <token> <refreshed µs> <age
// ms>"; ok is false for anything else (an empty message: the lock is free).
func parseGrant(payload string) (holder string, g grantMsg, ok bool) {
	holder, rest, ok1 := strings.Cut(payload, " ")
	tok, rest, ok2 := strings.Cut(rest, " ")
	ref, age, ok3 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 {
		return "", g, false
	}
	var err1, err2, err3 error
	g.token, err1 = strconv.ParseInt(tok, 10, 64)
	g.ref, err2 = strconv.ParseInt(ref, 10, 64)
	ms, err3 := strconv.ParseInt(age, 10, 64)
	// An age past what a Duration holds would wrap and date the lease wrong.
	if err1 != nil || err2 != nil || err3 != nil || g.token < 1 || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return "", g, false
	}
	g.age = time.Duration(ms) * time.Millisecond
	return holder, g, true
}

func newGen(ps *redis.PubSub) *psGen {
	g := &psGen{written: make(chan struct{})}
	if ps != nil {
		g.ps.Store(ps)
	}
	return g
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
			case w.grant <- g:
			default:
			}
			continue
		}
		// Every other waiter moved one place up the queue: the one that
		// becomes the head must learn it, to try when this lease ends.
		select {
		case w.moved <- struct{}{}:
		default:
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
			h: h, key: key, gen: newGen(h.newPubSub()),
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
	w := &waiter{t: t, holder: holder, wake: make(chan struct{}, 1), grant: make(chan grantMsg, 1), moved: make(chan struct{}, 1)}
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

// close stops every connection and waits for their goroutines. Waiters
// still waiting fall back to timed retries.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	var gens []*psGen
	for key, c := range h.conns {
		delete(h.conns, key)
		gens = append(gens, c.retire())
	}
	h.mu.Unlock()
	for _, g := range gens {
		g.close()
	}
	h.wg.Wait()
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
	ps := op.gen.ps.Load()
	if ps == nil {
		// A Ring's generation: its first subscribe makes the PubSub.
		if op.sub {
			c.ringStart(ctx, op)
		}
		op.gen.once.Do(func() { close(op.gen.written) })
		return
	}
	switch sharded := c.h.mode == subSharded; {
	case op.sub && sharded:
		_ = ps.SSubscribe(ctx, op.channel)
	case op.sub:
		_ = ps.Subscribe(ctx, op.channel)
	case sharded:
		_ = ps.SUnsubscribe(ctx, op.channel)
	default:
		_ = ps.Unsubscribe(ctx, op.channel)
	}
	op.gen.once.Do(func() { close(op.gen.written) })
}

// ringStart makes the PubSub of a Ring's generation by subscribing op's
// channel on it, and closes it again if the generation was replaced or the
// connection retired meanwhile.
func (c *subConn) ringStart(ctx context.Context, op subOp) {
	ps := c.h.ringSubscribe(ctx, op.channel)
	if ps == nil {
		return
	}
	op.gen.ps.Store(ps)
	c.h.mu.Lock()
	dead := c.retired || c.gen != op.gen
	c.h.mu.Unlock()
	if dead {
		_ = ps.Close()
	}
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
	ps := g.ps.Load()
	if ps == nil {
		return false // a Ring's first subscribe failed
	}
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), healthEvery)
		select {
		case <-c.quit:
			return true
		default:
		}
		c.sweep()
		switch {
		case err == nil:
			pinged, *failures = false, 0
			if c.handle(msg) {
				return false
			}
		case isTimeout(err):
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

// isTimeout reports whether err is a read that timed out. It is apart from
// receive so that its net.Error, which errors.As moves to the heap, is
// allocated only on an error, not for every message received.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// handle applies one received message; it reports whether the connection
// must be replaced (the server dropped a subscription on its own, as a
// cluster does when the channel's slot moves).
func (c *subConn) handle(msg any) (broken bool) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	switch m := msg.(type) {
	case *redis.Subscription:
		ch := m.Channel
		switch m.Kind {
		case "subscribe", "ssubscribe":
			if c.pending[ch] > 0 {
				c.pending[ch]--
			}
			if c.pending[ch] == 0 {
				delete(c.pending, ch)
				if t := c.topics[ch]; t != nil && c.unsubs[ch] == 0 {
					t.setReady()
				}
			}
		case "unsubscribe", "sunsubscribe":
			if c.unsubs[ch] > 0 {
				if c.unsubs[ch]--; c.unsubs[ch] == 0 {
					delete(c.unsubs, ch)
				}
			} else if c.topics[ch] != nil {
				return true
			}
		}
	case *redis.Message:
		t := c.topics[m.Channel]
		if t == nil {
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
	c.gen = newGen(c.h.newPubSub())
	c.pending, c.unsubs, c.ops = make(map[string]int), make(map[string]int), nil
	for ch := range c.topics {
		c.pending[ch] = 1
		c.enqueue(subOp{gen: c.gen, sub: true, channel: ch})
	}
	c.h.mu.Unlock()
	return true
}

// acquireWaiting is Acquire: it tries, and after each refusal waits for a
// grant or a release message, the current lease's end, the time to
// refresh its queue entry, or (without a confirmed subscription) the wait
// strategy's delay, whichever comes first.
func (l *Locker) acquireWaiting(ctx context.Context, resource string, ttl time.Duration, cfg acquireConfig) (lease *Lease, err error) {
	// Every try respects the queue, whether or not it can join it yet: a
	// free lock with live waiters queued ahead goes to the first of them.
	a := attempt{holder: fence.NewHolder(), ordered: true, place: -1}
	var (
		w       *waiter
		channel string
	)
	if l.hub != nil {
		channel = l.channel(resource)
		// Joining a channel that other waiters keep subscribed costs
		// nothing and makes even the first try a registered one.
		w = l.hub.join(channel, false, a.holder)
		defer func() { l.hub.leave(w, lease != nil) }()
	}
	defer func() {
		if lease == nil && a.queued() {
			// Out of the queue; a grant made to this holder meanwhile is
			// given back and handed on.
			acq := ""
			if cfg.owner != "" {
				acq = a.holder
			}
			l.cleanup(ctx, resource, a.holder, acq)
		}
	}()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	fallbacks := 0
	for {
		var ready, lost <-chan struct{}
		confirmed := false
		if w != nil {
			ready, lost, confirmed = w.state()
		}
		// Queue only on a try the subscription covers, so that the grant's
		// message cannot be missed; once queued, every try refreshes the
		// entry.
		a.queue = w != nil && (confirmed || a.queued())
		lease, err = l.tryAcquire(ctx, resource, ttl, cfg, &a)
		var na *NotAcquiredError
		if !errors.As(err, &na) {
			return lease, err
		}
		if w != nil {
			w.owes = false
		}
		if w == nil && l.hub != nil {
			if w = l.hub.join(channel, true, a.holder); w != nil {
				if ready, lost, confirmed = w.state(); confirmed {
					continue // someone else's subscription covers a try from now on
				}
			}
		}
		var d time.Duration
		switch {
		case confirmed:
			// Only the head of the queue has a reason to try when the
			// current lease ends (a holder that vanished): any other
			// waiter's try would find the lock handed to the head. The
			// others only refresh their entry, once a second.
			d = queueRefresh
			if a.head && na.Remaining >= 0 {
				d = min(d, na.Remaining)
			}
		default:
			d = l.wait.Delay(fallbacks, na.Remaining)
			fallbacks++
			if na.Remaining >= 0 && d > na.Remaining {
				d = na.Remaining
			}
		}
		var (
			wake, edge, moved <-chan struct{}
			granted           <-chan grantMsg
		)
		if w != nil {
			wake, granted, moved = w.wake, w.grant, w.moved
			if confirmed {
				edge = lost // back to timed retries
			} else {
				edge = ready // registered from now on: try again
			}
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("lock: acquire %q: %w", resource, ctx.Err())
			case <-timer.C:
			case <-wake:
				w.owes = true
			case <-edge:
			case g := <-granted:
				if lease = l.handedOver(resource, ttl, cfg, &a, g); lease != nil {
					return lease, nil
				}
			case <-moved:
				// The lock went to a waiter ahead: the one that was next in
				// line is now the head and tries at once, to learn the new
				// lease's end (one try per grant); the others keep waiting
				// for their refresh.
				if a.place > 0 {
					a.place--
				}
				if a.place != 0 {
					continue wait
				}
			}
			break
		}
	}
}

// handedOver is the lease a release granted to a's holder, as its message
// g tells, or nil when g cannot be dated (the next try finds the grant).
//
// The grant came after the release read the holder's entry as refreshed at
// g.ref, and g.age after that refresh on the server's clock; the try that
// made that refresh was sent no later than it ran. So a.sent + g.age is no
// later than the grant, and the lease is dated from there. A message about
// an older entry than a's last refresh is stale: that refresh found the
// lock in other hands, so the grant it names is gone.
func (l *Locker) handedOver(resource string, ttl time.Duration, cfg acquireConfig, a *attempt, g grantMsg) *Lease {
	if g.ref != a.ref {
		return nil
	}
	acq := ""
	if cfg.owner != "" {
		acq = a.holder
	}
	lease := &Lease{l: l, acq: acq}
	keys, channel := l.resourceKeys(&lease.keyBuf, resource)
	l.grantLease(lease, keys, channel, a.holder, fence.Fence{Resource: resource, Token: fence.Token(g.token), Holder: a.holder}, a.sent.Add(g.age), ttl, ttl, cfg)
	return lease
}
