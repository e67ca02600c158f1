package testenv

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy between clients and one server, for tests that need
// real network faults: a reply lost on a connection that then breaks (what
// makes go-redis retry a command the server already ran), a network that
// stops carrying traffic, a slow network, a reply held past the client's
// read timeout, and connections cut all at once or refused for a while.
// [Proxy.Faults] counts the faults actually injected.
//
// Every connection accepted on [Proxy.Addr] is forwarded to the target over
// a connection of its own. The proxy is closed, with every connection, when
// the test ends.
type Proxy struct {
	t      testing.TB
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	links  map[*link]struct{}
	lose   func() // armed by LoseNextReply; run once, then nil
	armed  bool
	gate   chan struct{} // non-nil while blocked; closed by Unblock
	closed bool
	delay  time.Duration // added to every chunk, each way (SetLatency)
	refuse time.Time     // new connections are reset until then (CutFor)

	hold     func()        // armed by HoldNextReply; run once, then nil
	holdFor  time.Duration // how long the held reply waits
	holdArmd bool

	reqFor   time.Duration // armed by HoldNextRequest: how long the request waits
	reqReset bool          // and whether its client is reset meanwhile
	reqArmd  bool

	drop     func() // armed by DropNextRequest; run once, then nil
	dropArmd bool

	faults ProxyFaults // what was actually done to traffic
}

// ProxyFaults counts the faults a [Proxy] actually injected, as opposed to
// the ones it was asked for: an armed [Proxy.LoseNextReply] that no reply
// came through counts nothing.
type ProxyFaults struct {
	// Lost counts replies dropped by LoseNextReply.
	Lost int
	// Held counts replies held by HoldNextReply.
	Held int
	// Cut counts connections cut by CutAll and CutFor, each once.
	Cut int
	// HeldRequests counts requests held by HoldNextRequest and then
	// delivered to the server.
	HeldRequests int
	// Dropped counts requests dropped by DropNextRequest.
	Dropped int
}

// link is one client connection and its server connection.
type link struct {
	client net.Conn
	done   chan struct{} // closed by cut

	mu     sync.Mutex
	server net.Conn // nil until connected
	isCut  bool
	silent bool // SilenceOpen: nothing more is forwarded, nothing closed
}

// cut closes both connections; it may be called any number of times, and
// reports whether this call was the one that cut.
func (l *link) cut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isCut {
		return false
	}
	l.isCut = true
	close(l.done)
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
	return true
}

// connect attaches the server connection s, or closes s and reports false
// when l was cut meanwhile.
func (l *link) connect(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isCut {
		_ = s.Close()
		return false
	}
	l.server = s
	return true
}

// StartProxy listens on a free loopback port and forwards every connection
// to target (host:port). It stops when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	p := &Proxy{t: t, target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// LoseNextReply arms the proxy once: the next bytes that any server sends
// are not forwarded, then (if not nil) runs, and then that connection is cut
// on both sides. For a client that sends one command at a time on a
// connection, those bytes are the reply to a command the server has run: the
// client sees the connection break and cannot tell whether the command ran.
//
// then runs on the proxy's goroutine while the client still waits for its
// reply, so whatever it does happens after the server ran the command and
// before any retry of it; it must not call t.Fatal (t.Error is fine).
// Arming again before the reply is lost replaces then.
func (p *Proxy) LoseNextReply(then func()) {
	p.mu.Lock()
	p.lose, p.armed = then, true
	p.mu.Unlock()
}

// HoldNextReply arms the proxy once: the next bytes that any server sends
// are held for d before they are forwarded, on that connection only, while
// its other direction keeps flowing. A client whose read timeout is shorter
// than d gives up on the reply (go-redis then closes the connection and
// retries the command on another), and the held bytes go nowhere; a
// patient client gets them late. then (if not nil) runs on the proxy's
// goroutine when the hold begins, as with [Proxy.LoseNextReply]. Arming
// again before a reply is held replaces d and then.
func (p *Proxy) HoldNextReply(d time.Duration, then func()) {
	p.mu.Lock()
	p.hold, p.holdFor, p.holdArmd = then, d, true
	p.mu.Unlock()
}

// SilenceOpen makes every connection open now silent, both ways, for good:
// nothing more is forwarded on it and nothing closes it (no FIN, no RST),
// as a peer that vanished or a middlebox that dropped the flow would.
// Connections made afterwards are forwarded as before.
func (p *Proxy) SilenceOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.mu.Lock()
		l.silent = true
		l.mu.Unlock()
	}
}

// HoldNextRequest arms the proxy once: the next bytes that any client
// sends are held for d and then delivered to the server, even if the client
// gave up on them meanwhile (its connection closed or reset): a request
// late in the network, which the server runs after its client stopped
// waiting. reset makes the proxy reset the client's side of that connection
// at once (the client sees an error and may retry on another connection)
// while the request is still held. Arming again before a request is held
// replaces d and reset.
func (p *Proxy) HoldNextRequest(d time.Duration, reset bool) {
	p.mu.Lock()
	p.reqFor, p.reqReset, p.reqArmd = d, reset, true
	p.mu.Unlock()
}

// DropNextRequest arms the proxy once: the next bytes that any client
// sends are never delivered to the server, and their connection stays
// open, carrying what follows as before: a request lost in the network.
// Its client cannot tell; it waits for a reply that never comes until it
// gives up. then (if not nil) runs on the proxy's goroutine when the
// request is dropped. Arming again before a request is dropped replaces
// then.
func (p *Proxy) DropNextRequest(then func()) {
	p.mu.Lock()
	p.drop, p.dropArmd = then, true
	p.mu.Unlock()
}

// Faults returns the faults the proxy has injected so far.
func (p *Proxy) Faults() ProxyFaults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// Block stops the proxy from carrying traffic, like a network partition:
// bytes already sent are held, not delivered, and new connections are
// accepted but not forwarded. Connections stay open, so clients see timeouts
// rather than errors. Held bytes are delivered after [Proxy.Unblock] if
// their connection is still open, as TCP would retransmit them.
func (p *Proxy) Block() {
	p.mu.Lock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
	p.mu.Unlock()
}

// Unblock makes the proxy carry traffic again after [Proxy.Block].
func (p *Proxy) Unblock() {
	p.mu.Lock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
	p.mu.Unlock()
}

// CutAll closes every open connection, on both sides, as a reset would.
// New connections are accepted and forwarded as before.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	n := 0
	for _, l := range links {
		if l.cut() {
			n++
		}
	}
	p.mu.Lock()
	p.faults.Cut += n
	p.mu.Unlock()
}

// SetLatency delays every chunk of bytes, in each direction, by d from
// the moment the proxy read it, as a slow link would: a request and its
// reply arrive 2·d late. Bytes of one direction stay in order, and a chunk
// read while an earlier one waits waits behind it. d = 0 ends the delay
// (chunks already waiting still wait out theirs).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// CutFor cuts every open connection, as [Proxy.CutAll] does, and for d
// afterwards closes each new connection as soon as it is accepted, as a
// peer that resets connections would: clients see errors at once, not
// timeouts.
func (p *Proxy) CutFor(d time.Duration) {
	p.mu.Lock()
	p.refuse = time.Now().Add(d)
	p.mu.Unlock()
	p.CutAll()
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CutAll()
	p.Unblock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		if time.Now().Before(p.refuse) {
			p.mu.Unlock()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not an orderly close
			}
			_ = c.Close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve connects l to the target and copies both ways until either side
// ends or l is cut.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.cut()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if !p.wait(l) {
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.t.Logf("testenv: proxy dial %s: %v", p.target, err)
		return
	}
	if !l.connect(s) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.copy(l, s, l.client, false)
	}()
	p.copy(l, l.client, s, true)
	wg.Wait()
}

// copy forwards src to dst until an error or a cut, then cuts l.
// fromServer marks the direction that LoseNextReply acts on.
func (p *Proxy) copy(l *link, dst, src net.Conn, fromServer bool) {
	defer func() { l.cut() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		l.mu.Lock()
		silent := l.silent
		l.mu.Unlock()
		if silent {
			// Swallowed, a close too: the other side learns nothing;
			// only the proxy's end (or CutAll) cuts the link.
			<-l.done
			return
		}
		if n > 0 {
			if !p.sleep(l, time.Now()) || !p.wait(l) {
				return
			}
			if !fromServer {
				if then, ok := p.takeDrop(); ok {
					if then != nil {
						then()
					}
					if err != nil {
						return
					}
					continue
				}
				if d, reset, ok := p.takeHoldRequest(); ok {
					if reset {
						if tc, ok := l.client.(*net.TCPConn); ok {
							_ = tc.SetLinger(0)
						}
						_ = l.client.Close()
					}
					// Held whatever the client does meanwhile: only a cut
					// of the whole link (CutAll, the proxy's end) drops it.
					if !p.pause(l, d) {
						return
					}
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
					p.mu.Lock()
					p.faults.HeldRequests++
					p.mu.Unlock()
					if reset {
						// The server's reply, failing to reach the reset
						// client, ends the link; until then the server
						// runs the request on a session still open.
						select {
						case <-l.done:
						case <-time.After(5 * time.Second):
						}
						return
					}
					if err != nil {
						return
					}
					continue
				}
			}
			if fromServer {
				if then, ok := p.takeLose(); ok {
					if then != nil {
						then()
					}
					return // the reply is dropped and the connection cut
				}
				if d, then, ok := p.takeHold(); ok {
					if then != nil {
						then()
					}
					if !p.pause(l, d) {
						return
					}
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) takeLose() (func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.armed {
		return nil, false
	}
	then := p.lose
	p.lose, p.armed = nil, false
	p.faults.Lost++
	return then, true
}

func (p *Proxy) takeDrop() (func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropArmd {
		return nil, false
	}
	then := p.drop
	p.drop, p.dropArmd = nil, false
	p.faults.Dropped++
	return then, true
}

func (p *Proxy) takeHold() (time.Duration, func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holdArmd {
		return 0, nil, false
	}
	d, then := p.holdFor, p.hold
	p.hold, p.holdFor, p.holdArmd = nil, 0, false
	p.faults.Held++
	return d, then, true
}

func (p *Proxy) takeHoldRequest() (time.Duration, bool, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reqArmd {
		return 0, false, false
	}
	p.reqArmd = false
	return p.reqFor, p.reqReset, true
}

// pause waits d; it reports false once l is cut.
func (p *Proxy) pause(l *link, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// sleep waits out the latency of a chunk read at read; it reports false
// once l is cut.
func (p *Proxy) sleep(l *link, read time.Time) bool {
	p.mu.Lock()
	d := p.delay
	p.mu.Unlock()
	if d <= 0 {
		return true
	}
	t := time.NewTimer(time.Until(read.Add(d)))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// wait returns once the proxy is not blocked, true, or once l is cut, false.
func (p *Proxy) wait(l *link) bool {
	for {
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		if gate == nil {
			select {
			case <-l.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-gate:
		case <-l.done:
			return false
		}
	}
}
