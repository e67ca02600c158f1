package mysqllock

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// MySQL has no LISTEN/NOTIFY, so a waiting Locker keeps a doorbell: one
// connection of the pool, taken out of it while the Locker has waiters,
// that sleeps a second at a time (SELECT SLEEP(1)). A waiter's queue entry
// names that connection's id; the release (or try) that hands the lock to
// the waiter interrupts the sleep with KILL QUERY, after its transaction
// committed, and the doorbell then reads which of its Locker's waiters
// were handed a lock (one SELECT) and tells each its token. After every
// sleep the doorbell reads the same way, so a ring that found it between
// two statements (KILL QUERY interrupts only a running statement) delays
// a hand-over by one second at most: the doorbell reads once a second while
// its Locker waits, and not at all otherwise.
//
// The connection is discarded when the doorbell stops (the session's
// settings it changed never reach the pool), bellLinger after its Locker's
// last waiter left.

// bellLinger is how long the doorbell stays up after its last waiter left,
// so that the next Acquire is covered from its first try.
const bellLinger = 5 * time.Second

// handedSQL reads which of the listed resources were handed to a waiter
// whose lease still runs (see fencekit_lock_hand_over); %s is the list.
const handedSQL = `SELECT resource, holder, token, handed_ref, handed_us FROM fencekit_lock
WHERE resource IN (%s) AND handed_ref IS NOT NULL
  AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// bellSessionSQL are the doorbell's session settings: each SELECT sees
// the newest commits, and no timeout a default set cuts the sleep short.
var bellSessionSQL = []string{
	"SET autocommit = 1",
	"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
	"SET SESSION max_statement_time = 0", // MariaDB; refused by MySQL
	"SET SESSION max_execution_time = 0", // MySQL; refused by MariaDB
}

type bell struct {
	b *backend

	mu       sync.Mutex
	session  uint64        // the doorbell's connection id; 0 while down
	upC      chan struct{} // closed once up
	downC    chan struct{} // closed when the current up ends
	running  bool
	users    int
	lastUser time.Time

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
	rung   atomic.Int64 // rings heard (tests)
}

func newBell(b *backend) *bell {
	ctx, cancel := context.WithCancel(context.Background())
	return &bell{b: b, upC: make(chan struct{}), downC: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// id is the doorbell's connection id, 0 while it is down.
func (l *bell) id() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.session
}

// state returns whether the doorbell is up, the channel that closes once
// it is, and the one that closes when it goes down.
func (l *bell) state() (up bool, upC, downC <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.session != 0, l.upC, l.downC
}

// use counts a waiter in, starting the doorbell if it is not running.
func (l *bell) use() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.users++
	if !l.running && l.ctx.Err() == nil {
		l.running = true
		l.done.Add(1)
		go l.run()
	}
}

// unuse counts a waiter out.
func (l *bell) unuse() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.users--
	l.lastUser = time.Now()
}

// quiet reports whether the doorbell may stop: no waiter for bellLinger,
// or the backend closed. l.mu is held.
func (l *bell) quiet() bool {
	return l.users == 0 && time.Since(l.lastUser) > bellLinger || l.ctx.Err() != nil
}

// idle reports whether the doorbell may stop.
func (l *bell) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiet()
}

// stopping reports, and records, that the doorbell stops; a waiter that
// joins after starts it again.
func (l *bell) stopping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.quiet() {
		l.running = false
		return true
	}
	return false
}

func (l *bell) setUp(session uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.session = session
	l.downC = make(chan struct{})
	close(l.upC)
}

func (l *bell) setDown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.session == 0 {
		return
	}
	l.session = 0
	l.upC = make(chan struct{})
	close(l.downC)
}

func (l *bell) close() {
	l.cancel()
	l.done.Wait()
}

func (l *bell) run() {
	defer l.done.Done()
	backoff := 10 * time.Millisecond
	for !l.stopping() {
		conn, session, err := l.connect()
		if err != nil {
			select {
			case <-l.ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, lockbackend.QueueRefresh)
			continue
		}
		backoff = 10 * time.Millisecond
		l.setUp(session)
		l.serve(conn)
		l.setDown()
		discard(conn)
	}
}

// connect takes the doorbell's connection out of the pool and sets it up.
func (l *bell) connect() (*sql.Conn, uint64, error) {
	ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	defer cancel()
	conn, err := l.b.db.Conn(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, s := range bellSessionSQL {
		_, _ = conn.ExecContext(ctx, s)
	}
	var session uint64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&session); err != nil {
		discard(conn)
		return nil, 0, err
	}
	return conn, session, nil
}

// serve reads and sleeps on conn until it breaks or the doorbell stops.
func (l *bell) serve(conn *sql.Conn) {
	for !l.idle() {
		if err := l.check(conn); err != nil && !interrupted(err) {
			return
		}
		var slept sql.NullInt64
		l.b.sent.Add(1)
		err := conn.QueryRowContext(l.ctx, bellSleepSQL).Scan(&slept)
		switch {
		case err == nil && slept.Int64 == 1, interrupted(err):
			l.rung.Add(1)
		case err != nil:
			return
		}
	}
}

// check reads which of the Locker's waiting resources were handed to one
// of its waiters and tells each.
func (l *bell) check(conn *sql.Conn) error {
	resources := l.b.waiting()
	if len(resources) == 0 {
		return nil
	}
	var list strings.Builder
	for i, r := range resources {
		if i > 0 {
			list.WriteString(", ")
		}
		writeLiteral(&list, r)
	}
	ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	defer cancel()
	l.b.sent.Add(1)
	rows, err := conn.QueryContext(ctx, strings.Replace(handedSQL, "%s", list.String(), 1))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			resource, holder     string
			token, ref, handedAt int64
		)
		if err := rows.Scan(&resource, &holder, &token, &ref, &handedAt); err != nil {
			return err
		}
		l.b.handedOver(resource, holder, lockbackend.HandOver{
			Token: fence.Token(token), Ref: ref, Age: time.Duration(max(0, handedAt-ref)) * time.Microsecond,
		})
	}
	return rows.Err()
}
