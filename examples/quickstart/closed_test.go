package main

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// closedAddr returns a local address where nothing listens, for as long as
// the test runs: a socket bound to it, never listening, keeps the port
// from every other listener (a port merely closed again, as before, could
// be taken by one of the servers and proxies other tests start meanwhile,
// and then the program reached a server instead of failing to dial), and
// the kernel refuses every connection to it.
func closedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("bound to %v, want an IPv4 address", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Port))
}
