package etcdtest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/textproto"
	"sync"
	"time"
)

// Partition stands between the members of a Cluster on their peer ports:
// every member advertises a peer address of the partition's, which
// forwards to the member's own. Peer connections are HTTP, and etcd's
// raft transport names the member that made each one in its first
// request's X-Server-From header, so the partition can cut a member off
// from its peers in both directions: it refuses and closes the
// connections made to that member and those made by it. Connections that
// name no member (a follower's forwarded lease renewals, version probes)
// are cut only when made to an isolated member.
type Partition struct {
	mu       sync.Mutex
	isolated map[string]bool // member ids, as etcd writes them
	conns    map[*peerConn]struct{}
	lns      []net.Listener
	wg       sync.WaitGroup
}

type peerConn struct {
	from, to string // member ids; from is "" when the request names none
	a, b     net.Conn
}

func newPartition(t tb) *Partition {
	p := &Partition{isolated: map[string]bool{}, conns: map[*peerConn]struct{}{}}
	t.Cleanup(p.close)
	return p
}

// listen starts forwarding a new peer address to target, the member m's own
// peer address, and returns it.
func (p *Partition) listen(t tb, m *Member, target string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.lns = append(p.lns, ln)
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c, m, target) })
		}
	})
	return ln.Addr().String()
}

func (p *Partition) serve(c net.Conn, m *Member, target string) {
	// The first request's head names the member that dialled.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var head bytes.Buffer
	from := ""
	for head.Len() < 64<<10 {
		line, err := br.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			c.Close()
			return
		}
		if k, v, ok := bytes.Cut(bytes.TrimSpace([]byte(line)), []byte(":")); ok &&
			textproto.CanonicalMIMEHeaderKey(string(k)) == "X-Server-From" {
			from = string(bytes.TrimSpace(v))
		}
		if line == "\r\n" || line == "\n" {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	to := m.id()
	s, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	pc := &peerConn{from: from, to: to, a: c, b: s}
	p.mu.Lock()
	if p.isolated[to] || (from != "" && p.isolated[from]) {
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	if _, err := s.Write(head.Bytes()); err != nil {
		c.Close()
		s.Close()
		return
	}
	done := make(chan struct{}, 1)
	go p.pipe(s, br, done)
	p.pipe(c, s, nil)
	<-done
}

// pipe copies from src to dst until either ends, then closes dst.
func (p *Partition) pipe(dst net.Conn, src io.Reader, done chan<- struct{}) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	if done != nil {
		done <- struct{}{}
	}
}

// Isolate cuts member m off from its peers, both ways, until Heal.
func (p *Partition) Isolate(m *Member) {
	id := m.id()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isolated[id] = true
	for pc := range p.conns {
		if pc.to == id || pc.from == id {
			pc.a.Close()
			pc.b.Close()
		}
	}
}

// Heal ends every isolation.
func (p *Partition) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.isolated)
}

func (p *Partition) close() {
	p.mu.Lock()
	for _, ln := range p.lns {
		ln.Close()
	}
	for pc := range p.conns {
		pc.a.Close()
		pc.b.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
