package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// listener is a backend's one LISTEN connection: it receives the lock's
// and the record's notifications and hands each to the subscriptions of
// its resource. It opens its own connection as the pool opens its own
// (the pool's settings and its BeforeConnect and AfterConnect hooks: a
// LISTEN must outlive any one statement, so a pooled connection will not
// do) and opens it again, with backoff, when it breaks or goes silent (see
// listenPing); while it is down, waiters are told so (their coverage is
// lost) and poll, and each failure to connect is reported.
type listener struct {
	pool   *pgxpool.Config // the pool's settings and connect hooks
	cancel context.CancelFunc
	done   chan struct{}
	report func(err error) // a connection that failed, or went silent

	curPID atomic.Uint32 // the LISTEN session's backend pid; 0 while down

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

func newListener(pool *pgxpool.Pool, report func(error)) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	if report == nil {
		report = func(error) {}
	}
	l := &listener{
		pool:   pool.Config(),
		report: report,
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

// pid is the backend pid of the LISTEN session, 0 while there is none.
func (l *listener) pid() uint32 { return l.curPID.Load() }

// Timings of the listener.
const (
	// listenPing is how long the LISTEN connection may stay quiet before
	// the listener pings it; listenPingTimeout how long the ping may take
	// before the connection is taken as silent (gone without FIN or RST)
	// and replaced. A silent listener is so replaced within
	// listenPing + listenPingTimeout, and a connect.
	listenPing        = 2 * time.Second
	listenPingTimeout = 2 * time.Second
	// listenMark starts every statement of the listener, so that its
	// replacement finds the old session by its last statement.
	listenMark = "/* fencekit_lock listener */"
)

// listenSQL sets up the listener's session: no idle_session_timeout (the
// database's would end it between notifications), keepalives and a user
// timeout on the server's side of the connection (a client gone silent is
// dropped by the server's kernel within about 20 s, and its session ends),
// and the LISTENs.
const listenSQL = listenMark + ` LISTEN ` + lockChannel + `; LISTEN ` + recordChannel

// sessionSQL is sent after listenSQL, best effort (idle_session_timeout
// is PostgreSQL 14's, tcp_user_timeout 12's).
const sessionSQL = listenMark + ` SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 5; ` +
	`SET tcp_keepalives_count = 3; SET tcp_user_timeout = 20000; SET idle_session_timeout = 0`

// endSilentSQL ends the session of a listener that went silent, if it is
// still there and still the listener's (its last statement is one of the
// listener's): it would pin the database's NOTIFY queue until the server
// noticed. It needs the right to signal that session (the same role, or
// pg_signal_backend); without it the server's keepalives end it.
const endSilentSQL = listenMark + ` SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
WHERE pid = $1 AND datname = current_database() AND query LIKE '` + listenMark + `%'`

// connect opens a connection as the pool opens its own: its ConnConfig,
// its BeforeConnect (which may supply the address or a rotated password)
// and its AfterConnect.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg := l.pool.ConnConfig.Copy()
	if l.pool.BeforeConnect != nil {
		if err := l.pool.BeforeConnect(ctx, cfg); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if l.pool.AfterConnect != nil {
		if err := l.pool.AfterConnect(ctx, conn); err != nil {
			closeConn(conn)
			return nil, err
		}
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(ctx)
	cancel()
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	defer l.setUp(false)
	backoff := pollMin
	var silentPID uint32 // a session that went silent, to be ended
	for ctx.Err() == nil {
		conn, err := l.connect(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, listenSQL)
			if err != nil {
				closeConn(conn)
			} else {
				_, _ = conn.Exec(ctx, sessionSQL)
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				l.report(fmt.Errorf("pglock: the LISTEN connection cannot connect (waiters poll until it does): %w", err))
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, lockbackend.QueueRefresh)
			continue
		}
		backoff = pollMin
		l.curPID.Store(conn.PgConn().PID())
		if silentPID != 0 {
			endCtx, cancel := context.WithTimeout(ctx, listenPingTimeout)
			_, _ = conn.Exec(endCtx, endSilentSQL, silentPID) // best effort; see endSilentSQL
			cancel()
			silentPID = 0
		}
		l.setUp(true)
		silent := l.listen(ctx, conn)
		l.curPID.Store(0)
		l.setUp(false)
		if silent {
			silentPID = conn.PgConn().PID()
			l.report(errors.New("pglock: the LISTEN connection went silent; replacing it"))
		}
		closeConn(conn)
	}
}

// listen delivers conn's notifications until it breaks, goes silent (a
// ping unanswered within listenPingTimeout: true), or ctx ends.
func (l *listener) listen(ctx context.Context, conn *pgx.Conn) (silent bool) {
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		n, err := conn.WaitForNotification(wctx)
		quiet := wctx.Err() != nil
		cancel()
		if err != nil {
			if ctx.Err() != nil || !quiet {
				return false
			}
			// Quiet for listenPing: ask whether the session still answers.
			// (A timeout leaves pgx's connection usable.)
			pctx, cancel := context.WithTimeout(ctx, listenPingTimeout)
			_, err := conn.Exec(pctx, listenMark)
			cancel()
			if err != nil {
				return ctx.Err() == nil
			}
			continue
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
