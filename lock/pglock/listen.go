package pglock

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listener is a backend's one LISTEN connection: it receives the lock's
// and the record's notifications and hands each to the waiters and
// watchers of its resource. It opens its own connection with the pool's
// settings (a LISTEN must outlive any one statement, so a pooled
// connection will not do) and opens it again, with backoff, when it
// breaks; meanwhile up reports false and waiters poll.
type listener struct {
	cfg    *pgx.ConnConfig
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	subs   map[string]map[*subscription]struct{} // by resource mark
	isUp   bool
	upOnce chan struct{} // closed the first time LISTEN succeeded
}

// subscription receives the notifications of one resource.
type subscription struct {
	res string      // the resource's mark
	c   chan string // payloads after the resource mark; "" when the listener reconnected
}

// note is a notification of the lock channel: the marks of the waiter
// granted the lock and of the waiter now first ('-' none, '*' everyone).
type note struct {
	granted, head string
}

func newListener(pool *pgxpool.Pool) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		cfg:    pool.Config().ConnConfig.Copy(),
		cancel: cancel,
		done:   make(chan struct{}),
		subs:   make(map[string]map[*subscription]struct{}),
		upOnce: make(chan struct{}),
	}
	go l.run(ctx)
	return l
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

// up reports whether notifications currently reach the waiters.
func (l *listener) up() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isUp
}

// subscribe registers for the notifications of resource (its mark).
func (l *listener) subscribe(res string) *subscription {
	s := &subscription{res: res, c: make(chan string, 8)}
	l.mu.Lock()
	m := l.subs[res]
	if m == nil {
		m = make(map[*subscription]struct{})
		l.subs[res] = m
	}
	m[s] = struct{}{}
	l.mu.Unlock()
	return s
}

func (l *listener) unsubscribe(s *subscription) {
	l.mu.Lock()
	if m := l.subs[s.res]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(l.subs, s.res)
		}
	}
	l.mu.Unlock()
}

// deliver hands payload to every subscription of res, dropping it for a
// subscriber that has eight unread (it will read those and try again).
func (l *listener) deliver(res, payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[res] {
		select {
		case s.c <- payload:
		default:
		}
	}
}

// setUp records whether notifications flow; on every change every
// subscriber is told (""), since it may have missed one meanwhile.
func (l *listener) setUp(up bool) {
	l.mu.Lock()
	changed := l.isUp != up
	l.isUp = up
	var all []*subscription
	if changed {
		for _, m := range l.subs {
			for s := range m {
				all = append(all, s)
			}
		}
	}
	l.mu.Unlock()
	for _, s := range all {
		select {
		case s.c <- "":
		default:
		}
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := pollMin
	first := true
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+lockChannel+"; LISTEN "+recordChannel)
			if err == nil {
				backoff = pollMin
				l.setUp(true)
				if first {
					first = false
					close(l.upOnce)
				}
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
		backoff = min(2*backoff, queueRefresh)
	}
}

// parseNote reads a lock channel payload (after the resource mark).
func parseNote(payload string) (note, bool) {
	g, h, ok := strings.Cut(payload, " ")
	if !ok {
		return note{}, false
	}
	return note{granted: g, head: h}, true
}
