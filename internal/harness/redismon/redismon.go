// Package redismon records a Redis server's MONITOR feed and replays it
// into the election model's server log: the tests of the election on
// go-redis (package election) and on rueidis (lock/rueidisfence) judge the
// same scripts' writes from the same feed.
package redismon

import (
	"bufio"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
)

// A MONITOR feed of a model's private server holds every command the
// server ran, in its order, with the server's time, including those run by
// scripts (source "lua"). The election model replays it to judge what
// happened at Redis itself: who held the lock when the leader record was
// written, which token the record held before, and when the lock was next
// granted after a term was lost.

// Cmd is one command of the feed.
type Cmd struct {
	At   time.Time // the server's clock
	Lua  bool      // run by a script
	Args []string  // the command's name (upper case) and arguments
}

// Monitor records one server's feed.
type Monitor struct {
	conn net.Conn
	mu   sync.Mutex
	cmds []Cmd
	done chan struct{}
}

// Start opens a MONITOR connection to addr and records its feed until
// [Monitor.Stop].
func Start(t *testing.T, addr string) *Monitor {
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
	m := &Monitor{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if c, ok := ParseLine(strings.TrimRight(line, "\r\n")); ok {
				m.mu.Lock()
				m.cmds = append(m.cmds, c)
				m.mu.Unlock()
			}
		}
	}()
	return m
}

// Stop ends the feed and returns it.
func (m *Monitor) Stop() []Cmd {
	_ = m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmds
}

// ParseLine reads `+1795777344.298065 [0 lua] "SET" "k" "h1"`.
func ParseLine(line string) (Cmd, bool) {
	line = strings.TrimPrefix(line, "+")
	ts, rest, ok := strings.Cut(line, " [")
	if !ok {
		return Cmd{}, false
	}
	src, rest, ok := strings.Cut(rest, "] ")
	if !ok {
		return Cmd{}, false
	}
	sec, frac, _ := strings.Cut(ts, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err1 != nil || err2 != nil {
		return Cmd{}, false
	}
	args, ok := parseQuoted(rest)
	if !ok || len(args) == 0 {
		return Cmd{}, false
	}
	args[0] = strings.ToUpper(args[0])
	return Cmd{At: time.Unix(s, us*1000), Lua: strings.HasSuffix(src, " lua"), Args: args}, true
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

// keyState is a key of the replay: its value (a string, or a hash's fields)
// and when it expires (zero: never).
type keyState struct {
	val    string
	fields map[string]string
	expiry time.Time
	exists bool
}

// alive reports whether the key exists at at, with slack in the direction
// that judges less: a script's time and its log line's differ by a little.
func (k *keyState) alive(at time.Time, slack time.Duration) bool {
	return k.exists && (k.expiry.IsZero() || at.Before(k.expiry.Add(slack)))
}

// ServerLog replays the server's MONITOR feed into the model's
// events: the lock key's grants (set by a script) and releases (deleted,
// or set to another holder, while it lived), and the record's writes by a
// script with the lock key's holder then and the record they replaced.
func ServerLog(cmds []Cmd, lockKey, recKey string) *electionmodel.ServerLog {
	const slack = 2 * time.Millisecond
	s := &electionmodel.ServerLog{ReleasesKnown: true}
	add := func(e electionmodel.Event) { s.Events = append(s.Events, e) }
	lk, rk := &keyState{}, &keyState{}
	for _, c := range cmds {
		if len(c.Args) < 2 {
			continue
		}
		switch key := c.Args[1]; {
		case key == lockKey:
			switch c.Args[0] {
			case "SET":
				if len(c.Args) >= 5 && strings.EqualFold(c.Args[3], "PX") {
					// Handed over by a release, unless the lock was about to
					// run out (the log's time and the script's differ a
					// little): a grant at its end is judged for the gap.
					if lk.alive(c.At, -slack) && lk.val != c.Args[2] {
						add(electionmodel.Event{Kind: electionmodel.Released, At: c.At, Holder: lk.val})
					}
					ms, _ := strconv.ParseInt(c.Args[4], 10, 64)
					*lk = keyState{val: c.Args[2], exists: true, expiry: c.At.Add(time.Duration(ms) * time.Millisecond)}
					if c.Lua {
						add(electionmodel.Event{Kind: electionmodel.Granted, At: c.At, Holder: c.Args[2]})
					}
				}
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.Args[2], 10, 64); err == nil && lk.alive(c.At, 0) {
					lk.expiry = c.At.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				if lk.alive(c.At, 0) {
					add(electionmodel.Event{Kind: electionmodel.Released, At: c.At, Holder: lk.val})
				}
				*lk = keyState{}
			}
		case key == recKey:
			switch c.Args[0] {
			case "HSET":
				f := map[string]string{}
				for j := 2; j+1 < len(c.Args); j += 2 {
					f[c.Args[j]] = c.Args[j+1]
				}
				if c.Lua && f["h"] != "" && f["t"] != "" {
					tok, _ := strconv.ParseUint(f["t"], 10, 64)
					e := electionmodel.Event{Kind: electionmodel.Recorded, At: c.At, Holder: f["h"], Token: fence.Token(tok), Value: f["v"]}
					if lk.alive(c.At, slack) {
						e.LockHolder = lk.val
					}
					if rk.alive(c.At, -slack) {
						was, _ := strconv.ParseUint(rk.fields["t"], 10, 64)
						e.Replaced = &electionmodel.Record{Token: fence.Token(was), Holder: rk.fields["h"]}
					}
					add(e)
				}
				if !rk.alive(c.At, 0) {
					*rk = keyState{exists: true, fields: map[string]string{}}
				}
				maps.Copy(rk.fields, f)
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.Args[2], 10, 64); err == nil && rk.alive(c.At, 0) {
					rk.expiry = c.At.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				*rk = keyState{}
			}
		}
	}
	return s
}
