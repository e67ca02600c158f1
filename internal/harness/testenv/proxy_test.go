package testenv

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer echoes every connection back and counts the bytes it received.
func echoServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var got atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					got.Add(int64(n))
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), &got
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends msg and reads as many bytes back, within a deadline.
func roundTrip(c net.Conn, msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestProxyForwards(t *testing.T) {
	target, _ := echoServer(t)
	p := StartProxy(t, target)
	for _, msg := range []string{"a", "hello", "again"} {
		if got, err := roundTrip(dial(t, p.Addr()), msg); err != nil || got != msg {
			t.Fatalf("round trip %q = %q, %v", msg, got, err)
		}
	}
}

// TestProxyLoseNextReply checks that the server gets the request, the reply
// is lost, then runs before the client sees the cut, and later connections
// work again.
func TestProxyLoseNextReply(t *testing.T) {
	target, got := echoServer(t)
	p := StartProxy(t, target)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	p.LoseNextReply(func() { ran.Store(true) })
	_, err := roundTrip(c, "lost")
	if err == nil {
		t.Fatal("the reply arrived; want it lost and the connection cut")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read timed out (%v); want the connection cut", err)
	}
	if !ran.Load() {
		t.Fatal("then did not run before the client saw the cut")
	}
	if n := got.Load(); n != int64(len("warm")+len("lost")) {
		t.Fatalf("server received %d bytes; want the lost request too", n)
	}
	if got, err := roundTrip(dial(t, p.Addr()), "next"); err != nil || got != "next" {
		t.Fatalf("after the loss: %q, %v; want the proxy disarmed", got, err)
	}
}

func TestProxyBlock(t *testing.T) {
	target, got := echoServer(t)
	p := StartProxy(t, target)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	p.Block()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	// Nothing may come back while blocked; a short deadline shows it.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read while blocked = %d, %v; want a timeout", n, err)
	}
	if n := got.Load(); n != int64(len("warm")) {
		t.Fatalf("server received %d bytes while blocked; want %d", n, len("warm"))
	}
	p.Unblock()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after Unblock: %q, %v; want the held bytes delivered", buf, err)
	}
}

func TestProxyCutAll(t *testing.T) {
	target, _ := echoServer(t)
	p := StartProxy(t, target)
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	for _, c := range []net.Conn{a, b} {
		if _, err := roundTrip(c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	p.CutAll()
	for _, c := range []net.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after CutAll: %v; want the connection closed", err)
		}
	}
	if got, err := roundTrip(dial(t, p.Addr()), "new"); err != nil || got != "new" {
		t.Fatalf("new connection after CutAll: %q, %v", got, err)
	}
}

// TestProxyLatency checks that a round trip takes at least twice the
// latency (once each way) and that clearing it restores the link.
func TestProxyLatency(t *testing.T) {
	target, _ := echoServer(t)
	p := StartProxy(t, target)
	c := dial(t, p.Addr())
	const d = 50 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if got, err := roundTrip(c, "slow"); err != nil || got != "slow" {
		t.Fatalf("round trip with latency: %q, %v", got, err)
	}
	if took := time.Since(start); took < 2*d {
		t.Fatalf("round trip took %v; want at least %v", took, 2*d)
	}
	p.SetLatency(0)
	if got, err := roundTrip(c, "fast"); err != nil || got != "fast" {
		t.Fatalf("round trip after SetLatency(0): %q, %v", got, err)
	}
}

// TestProxyCutFor checks that open connections are cut, new ones are
// closed while the window lasts, and forwarded again after it.
func TestProxyCutFor(t *testing.T) {
	target, _ := echoServer(t)
	p := StartProxy(t, target)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	p.CutFor(200 * time.Millisecond)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after CutFor: %v; want the connection closed", err)
	}
	try := func(msg string) (string, error) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "", err // reset while connecting
		}
		defer c.Close()
		return roundTrip(c, msg)
	}
	if _, err := try("refused"); err == nil {
		t.Fatal("a new connection was forwarded during the cut")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := try("back")
		if err == nil && got == "back" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection forwarded 5s after the cut: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProxyHoldNextReply checks that the next reply is held for the given
// time (a client with a shorter read deadline times out), then delivered,
// and that Faults counts the hold, a lost reply and the connections cut.
func TestProxyHoldNextReply(t *testing.T) {
	target, _ := echoServer(t)
	p := StartProxy(t, target)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	const hold = 300 * time.Millisecond
	p.HoldNextReply(hold, func() { ran.Store(true) })
	start := time.Now()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read during the hold = %d, %v; want a timeout", n, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after the hold: %q, %v; want the held bytes", buf, err)
	}
	if took := time.Since(start); took < hold {
		t.Fatalf("held reply arrived after %v; want at least %v", took, hold)
	}
	if !ran.Load() {
		t.Fatal("then did not run")
	}
	if got, err := roundTrip(c, "next"); err != nil || got != "next" {
		t.Fatalf("after the hold: %q, %v; want the proxy disarmed", got, err)
	}
	p.LoseNextReply(nil)
	if _, err := roundTrip(c, "lost"); err == nil {
		t.Fatal("the reply arrived; want it lost")
	}
	d := dial(t, p.Addr())
	if _, err := roundTrip(d, "x"); err != nil {
		t.Fatal(err)
	}
	p.CutAll()
	if f := p.Faults(); f != (ProxyFaults{Lost: 1, Held: 1, Cut: 1}) {
		t.Fatalf("Faults() = %+v; want one lost, one held, one cut", f)
	}
}
