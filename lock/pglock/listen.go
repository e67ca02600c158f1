package pglock

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// listener is a backend's one LISTEN connection: it receives the lock's
// and the record's notifications and hands each to the subscriptions of
// its resource. It opens its own connection with the pool's settings (a
// LISTEN must outlive any one statement, so a pooled connection will not
// do) and opens it again, with backoff, when it breaks; while it is down,
// waiters are told so (their coverage is lost) and poll.
type listener struct {
	cfg    *pgx.ConnConfig
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	subs  map[string]map[*subscription]struct{} // by key: resource mark, or "r:" and it
	isUp  bool
	upC   chan struct{} // closed when LISTEN is next in place
	downC chan struct{} // closed when the connection that LISTENs next breaks
}

// subscription receives the notifications of one resource: each payload
// after the resource's mark, and "" when the listener went down or came
// back (a notification may have been missed).
type subscription struct {
	key string
	c   chan string
}

func newListener(pool *pgxpool.Pool) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		cfg:    pool.Config().ConnConfig.Copy(),
		cancel: cancel,
		done:   make(chan struct{}),
		subs:   make(map[string]map[*subscription]struct{}),
		upC:    make(chan struct{}),
		downC:  make(chan struct{}),
	}
	go l.run(ctx)
	return l
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

// up reports whether notifications currently reach the subscriptions.
func (l *listener) up() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isUp
}

// state returns whether notifications flow now, the channel that closes
// when they next do, and the one that closes when they next stop.
func (l *listener) state() (up bool, upC, downC <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isUp, l.upC, l.downC
}

// upped returns a channel closed once LISTEN is in place.
func (l *listener) upped() <-chan struct{} {
	up, upC, _ := l.state()
	if up {
		c := make(chan struct{})
		close(c)
		return c
	}
	return upC
}

// subscribe registers for the notifications of key.
func (l *listener) subscribe(key string) *subscription {
	s := &subscription{key: key, c: make(chan string, 16)}
	l.mu.Lock()
	m := l.subs[key]
	if m == nil {
		m = make(map[*subscription]struct{})
		l.subs[key] = m
	}
	m[s] = struct{}{}
	l.mu.Unlock()
	return s
}

func (l *listener) unsubscribe(s *subscription) {
	l.mu.Lock()
	if m := l.subs[s.key]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(l.subs, s.key)
		}
	}
	l.mu.Unlock()
}

// deliver hands payload to every subscription of key; a subscription with
// sixteen unread payloads gets "" in place of the oldest, which says that
// one was missed.
func (l *listener) deliver(key, payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[key] {
		send(s.c, payload)
	}
}

// send puts payload on c; when c is full it makes room by dropping the
// oldest and says that one was missed ("").
func send(c chan string, payload string) {
	for {
		select {
		case c <- payload:
			return
		default:
		}
		select {
		case <-c:
			payload = ""
		default:
		}
	}
}

// setUp records whether notifications flow, and tells every subscription
// of a change ("").
func (l *listener) setUp(up bool) {
	l.mu.Lock()
	if l.isUp == up {
		l.mu.Unlock()
		return
	}
	l.isUp = up
	if up {
		close(l.upC)
		l.downC = make(chan struct{})
	} else {
		close(l.downC)
		l.upC = make(chan struct{})
	}
	for _, m := range l.subs {
		for s := range m {
			send(s.c, "")
		}
	}
	l.mu.Unlock()
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	defer l.setUp(false)
	backoff := pollMin
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+lockChannel+"; LISTEN "+recordChannel)
			if err == nil {
				backoff = pollMin
				l.setUp(true)
				for {
					n, werr := conn.WaitForNotification(ctx)
					if werr != nil {
						break
					}
					res, rest, ok := strings.Cut(n.Payload, " ")
					if !ok {
						continue
					}
					if n.Channel == recordChannel {
						res = "r:" + res
					}
					l.deliver(res, rest)
				}
				l.setUp(false)
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, lockbackend.QueueRefresh)
	}
}

// note is a notification of the lock channel (see fencekit_lock_notify).
type note struct {
	granted   string // mark of the waiter handed the lock, "-" for none
	token     int64
	ref       int64
	age       time.Duration
	remaining time.Duration // freeLock (in ms) when the lock is free
	heads     [3]string     // marks of the first three live waiters
}

// parseNote reads a lock channel payload (after the resource mark).
func parseNote(payload string) (note, bool) {
	f := strings.Fields(payload)
	if len(f) != 8 {
		return note{}, false
	}
	var n note
	var nums [4]int64
	for i := range nums {
		v, err := strconv.ParseInt(f[1+i], 10, 64)
		if err != nil {
			return note{}, false
		}
		nums[i] = v
	}
	n.granted = f[0]
	n.token, n.ref = nums[0], nums[1]
	n.age = time.Duration(nums[2]) * time.Millisecond
	n.remaining = time.Duration(nums[3]) * time.Millisecond
	copy(n.heads[:], f[5:])
	return n, true
}

// placeOf is the place of mark among n's first three waiters, or -1.
func (n note) placeOf(mark string) int {
	for i, h := range n.heads {
		if h == mark {
			return i
		}
	}
	return -1
}

// free reports whether n says the lock is free with no live waiter.
func (n note) free() bool {
	return n.granted == "-" && n.remaining == freeLock*time.Millisecond && n.heads[0] == "-"
}
