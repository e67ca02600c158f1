package rueidisfence

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Redis MONITOR feed of the model's private server: every command the
// server ran, in its order, with the server's time, including those run by
// scripts (source "lua"). The election model replays it to judge what
// happened at Redis itself: who held the lock when the leader record was
// written, which token the record held before, and when the lock was next
// granted after a term was lost.

// monCmd is one command of the feed.
type monCmd struct {
	at   time.Time // the server's clock
	lua  bool      // run by a script
	args []string  // the command's name (upper case) and arguments
}

type monitor struct {
	conn net.Conn
	mu   sync.Mutex
	cmds []monCmd
	done chan struct{}
}

// startMonitor opens a MONITOR connection to addr and records its feed
// until stop.
func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	m := &monitor{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if c, ok := parseMonitorLine(strings.TrimRight(line, "\r\n")); ok {
				m.mu.Lock()
				m.cmds = append(m.cmds, c)
				m.mu.Unlock()
			}
		}
	}()
	return m
}

// stop ends the feed and returns it.
func (m *monitor) stop() []monCmd {
	_ = m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmds
}

// parseMonitorLine reads `+1795777344.298065 [0 lua] "SET" "k" "h1"`.
func parseMonitorLine(line string) (monCmd, bool) {
	line = strings.TrimPrefix(line, "+")
	ts, rest, ok := strings.Cut(line, " [")
	if !ok {
		return monCmd{}, false
	}
	src, rest, ok := strings.Cut(rest, "] ")
	if !ok {
		return monCmd{}, false
	}
	sec, frac, _ := strings.Cut(ts, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err1 != nil || err2 != nil {
		return monCmd{}, false
	}
	args, ok := parseQuoted(rest)
	if !ok || len(args) == 0 {
		return monCmd{}, false
	}
	args[0] = strings.ToUpper(args[0])
	return monCmd{at: time.Unix(s, us*1000), lua: strings.HasSuffix(src, " lua"), args: args}, true
}

// parseQuoted reads MONITOR's quoted arguments (C escapes, \xHH).
func parseQuoted(s string) ([]string, bool) {
	var out []string
	for i := 0; i < len(s); {
		if s[i] == ' ' {
			i++
			continue
		}
		if s[i] != '"' {
			return nil, false
		}
		i++
		var b strings.Builder
		for {
			if i >= len(s) {
				return nil, false
			}
			c := s[i]
			if c == '"' {
				i++
				break
			}
			if c != '\\' || i+1 >= len(s) {
				b.WriteByte(c)
				i++
				continue
			}
			switch e := s[i+1]; e {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+3 < len(s) {
					if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
						b.WriteByte(byte(v))
						i += 2
						break
					}
				}
				b.WriteByte('x')
			default:
				b.WriteByte(e)
			}
			i += 2
		}
		out = append(out, b.String())
	}
	return out, true
}
