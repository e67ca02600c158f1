package mysqllock

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// Timings of the backend.
const (
	// cleanupBound bounds the background cleanup of a grant whose caller
	// gave up while it was in flight (the KILL of its session, then the
	// release), and Close's wait for it.
	cleanupBound = 2 * time.Second
	// reclaimBatch is how many rows one reclaim deletes at most.
	reclaimBatch = 1000
	// retryMax is the longest pause between two tries of a statement the
	// server refused with a deadlock or a lock wait timeout.
	retryMax = 20 * time.Millisecond
	// brokenTries is how many times a statement is sent again after its
	// connection broke.
	brokenTries = 3
)

// backend is the MySQL lock: grants, releases, extensions, waiting in
// arrival order and the record beside the lock, each one CALL on the
// server's clock.
type backend struct {
	db         *sql.DB
	retention  time.Duration
	poll       bool
	background func(ctx context.Context, f func(ctx context.Context))
	onGrant    func(holder string) // tests: called before each grant is sent
	noKill     bool                // tests: a control that never kills a session whose reply was lost
	noDeadline bool                // tests: a control whose grants carry no deadline
	window     time.Duration       // grantWindow, or a test's
	onRecord   func()              // tests: called before each record write is sent
	noFast     bool                // tests: every grant and release through the procedures
	fastGrant  string              // fastGrantSQL, or a test's broken variant
	fastRel    string              // fastReleaseSQL, or a test's broken variant
	life       time.Duration       // how long a queue entry lives unrefreshed

	// sessions maps a pooled driver connection to its server-side id, so
	// that a statement whose reply was lost can have its session killed.
	sessions  sync.Map
	nSessions atomic.Int64
	mariaDB   atomic.Int32 // 0 unknown, 1 MariaDB, 2 MySQL
	sent      atomic.Int64 // statements sent, the doorbell's included (benchmarks)

	clock     atomic.Pointer[clockRef] // the client's clock mapped onto the server's
	clockBusy atomic.Bool              // a refresh of clock is under way
	late      lockbackend.LateRequests // grant requests that may still land

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // by resource
	closed  bool
	bell    *bell

	bg   sync.WaitGroup
	stop chan struct{}
	once sync.Once
}

// The backend implements the lock's contract: grants, a queue woken by
// the release, the record beside the lock and a token counter.
var (
	_ lockbackend.Backend    = (*backend)(nil)
	_ lockbackend.Queue      = (*backend)(nil)
	_ lockbackend.Recorder   = (*backend)(nil)
	_ lockbackend.Proclaimer = (*backend)(nil)
	_ lockbackend.Advancer   = (*backend)(nil)
)

// config is what a backend is made with.
type config struct {
	retention  time.Duration
	poll       bool
	reclaim    time.Duration       // how often idle rows are reclaimed; 0: never
	onGrant    func(holder string) // tests
	noKill     bool                // tests
	noDeadline bool                // tests
	window     time.Duration       // tests: grantWindow when 0
	onRecord   func()              // tests
	noFast     bool                // tests
	fastGrant  string              // tests: "" for fastGrantSQL
	fastRel    string              // tests: "" for fastReleaseSQL
}

func newBackend(db *sql.DB, cfg config, background func(ctx context.Context, f func(ctx context.Context))) *backend {
	b := &backend{db: db, retention: cfg.retention, poll: cfg.poll, background: background, onGrant: cfg.onGrant, noKill: cfg.noKill, onRecord: cfg.onRecord, noFast: cfg.noFast,
		noDeadline: cfg.noDeadline, window: cmp.Or(cfg.window, grantWindow),
		life: lockbackend.QueueLife, waiters: make(map[string]map[*waiter]struct{}), stop: make(chan struct{}),
		fastGrant: cmp.Or(cfg.fastGrant, fastGrantSQL), fastRel: cmp.Or(cfg.fastRel, fastReleaseSQL)}
	if !cfg.poll {
		b.bell = newBell(b)
	}
	if cfg.reclaim > 0 {
		b.bg.Add(1)
		go b.reclaimLoop(cfg.reclaim)
	}
	return b
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Info says what the backend offers: a queue unless it polls, no owners'
// re-entrant holds.
func (b *backend) Info() lockbackend.Info {
	return lockbackend.Info{Name: "mysql", Quorum: 1, Queue: !b.poll}
}

// checkArgs refuses bad input before anything is sent.
func checkArgs(ctx context.Context, op, resource, holder string, ttl time.Duration, needTTL bool) error {
	if ctx == nil {
		return invalid("%s %q: nil context", op, resource)
	}
	if resource == "" {
		return invalid("%s: empty resource name", op)
	}
	if len(resource) > fence.MaxResourceLen {
		return invalid("%s: resource name of %d bytes is longer than %d", op, len(resource), fence.MaxResourceLen)
	}
	if err := (fence.Fence{Resource: resource, Token: 1, Holder: "h"}).Validate(); err != nil {
		return invalid("%s: %v", op, err)
	}
	if holder == "" || len(holder) > 255 || !utf8.ValidString(holder) || strings.ContainsRune(holder, 0) {
		return invalid("%s %q: holder id empty, longer than 255 bytes, not valid UTF-8 or holding a NUL byte", op, resource)
	}
	if needTTL {
		if ttl < time.Millisecond {
			return invalid("%s %q: lease %v is shorter than 1ms", op, resource, ttl)
		}
		if ttl > lock.MaxTTL {
			return invalid("%s %q: lease %v is longer than %v", op, resource, ttl, lock.MaxTTL)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mysqllock: %s %q: %w", op, resource, err)
	}
	return nil
}

// call sends stmt on a connection of the pool and scans its one row into
// dest (see do).
func (b *backend) call(ctx context.Context, stmt string, dest ...any) error {
	return b.callTracked(ctx, nil, stmt, dest...)
}

// callTracked is call, setting *unkilled (when not nil) if a try whose
// reply was lost, tried again, may still run later (its session could not
// be killed).
func (b *backend) callTracked(ctx context.Context, unkilled *bool, stmt string, dest ...any) error {
	return b.do(ctx, false, unkilled, stmt, func(ctx context.Context, conn *sql.Conn, stmt string) error {
		return conn.QueryRowContext(ctx, stmt).Scan(dest...)
	})
}

// errNoFastPath says a fast-path UPDATE did not run: the session's
// autocommit is off, or a timeout cut it, so the procedure decides.
var errNoFastPath = errors.New("mysqllock: the session does not autocommit")

// exec sends the fast path's UPDATE stmt on a connection of the pool that
// autocommits, and returns the rows it changed and the reply's
// last-insert-id; errNoFastPath (nothing sent) when the session does not
// autocommit.
func (b *backend) exec(ctx context.Context, unkilled *bool, stmt string) (affected, lastID int64, err error) {
	err = b.do(ctx, true, unkilled, stmt, func(ctx context.Context, conn *sql.Conn, stmt string) error {
		res, err := conn.ExecContext(ctx, stmt)
		if err != nil {
			return err
		}
		affected, _ = res.RowsAffected()
		lastID, _ = res.LastInsertId()
		return nil
	})
	return affected, lastID, err
}

// do runs stmt with run on a connection of the pool. It tries again, while
// ctx lasts, after a deadlock or a lock wait timeout (the statement or the
// procedure rolled back: nothing happened), and after a broken connection,
// once the broken connection's session is killed (so that the first
// request, if it is still on its way, can run nothing). A statement
// interrupted by a kill or a timeout is tried again too: every statement
// answers a repeat of a run that happened as that run did.
//
// When no answer came back and the request may have run, the error is a
// *sentError naming the session it went out on (see mayHaveRun): the
// caller kills that session before it cleans up. *unkilled (when not nil)
// is set if an earlier try may still run later: its session could not be
// killed before the next try.
func (b *backend) do(ctx context.Context, fast bool, unkilled *bool, stmt string, run func(context.Context, *sql.Conn, string) error) error {
	var (
		ran     bool   // an earlier try may have run
		session uint64 // the session of the last try that may have run
		broken  int
	)
	for attempt := 0; ; attempt++ {
		session0, err := b.doOnce(ctx, fast, stmt, run)
		if err == nil || errors.Is(err, errNoFastPath) {
			return err
		}
		var sent *sentError
		if errors.As(err, &sent) {
			ran, session = true, sent.session
		}
		switch {
		case ctx.Err() != nil:
		case transient(err):
			if b.pause(ctx, attempt) {
				continue
			}
		case interrupted(err) && fast:
			// A timeout of the session's (or a KILL QUERY) cut the
			// autocommitted UPDATE, which rolled back whole: the
			// procedure, which lifts the timeout, decides.
			return errNoFastPath
		case interrupted(err):
			ran, session = true, session0
			if b.pause(ctx, attempt) {
				continue
			}
		case sent != nil || brokenConn(err):
			broken++
			if broken < brokenTries {
				if sent != nil {
					// Nothing of the first try may run after the second.
					if !b.kill(ctx, sent.session) && unkilled != nil {
						*unkilled = true
					}
				}
				if b.pause(ctx, 0) {
					continue
				}
			}
		}
		if ran && !mayHaveRun(err) {
			return &sentError{err: err, session: session}
		}
		return err
	}
}

// pause waits a random time below retryMax (growing with attempt) or
// until ctx ends; it reports whether ctx still lasts.
func (b *backend) pause(ctx context.Context, attempt int) bool {
	d := time.Duration(rand.Int64N(int64(min(retryMax, time.Millisecond<<min(attempt, 5))))) + 100*time.Microsecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// doOnce is one try of do; it returns the session id of the connection it
// used (0 when unknown).
func (b *backend) doOnce(ctx context.Context, fast bool, stmt string, run func(context.Context, *sql.Conn, string) error) (uint64, error) {
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return 0, err // nothing sent
	}
	s, err := b.session(ctx, conn)
	if err != nil {
		discard(conn)
		return 0, err // nothing of stmt sent
	}
	if fast && !s.autocommit {
		_ = conn.Close()
		return s.id, errNoFastPath
	}
	if !fast && b.mariaDB.Load() == 1 {
		// A fast-path UPDATE is one autocommitted statement: a timeout
		// that cuts it rolls it back whole, and it is tried again.
		stmt = mariaDBPrefix + stmt
	}
	b.sent.Add(1)
	err = run(ctx, conn, stmt)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		if _, isServer := serverError(err); !isServer {
			// The connection broke or ctx ended with the request sent:
			// it may have run, and a request still on its way may run
			// later. The connection is not used again.
			discard(conn)
			return s.id, &sentError{err: err, session: s.id}
		}
	}
	_ = conn.Close()
	return s.id, err
}

// discard closes conn and keeps the pool from using it again.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// sessionInfo is what the backend knows of a pooled connection's session.
type sessionInfo struct {
	id         uint64 // the server's id of the session, which a cleanup KILLs
	autocommit bool   // the session autocommits: the fast path may run
}

// session returns what conn's session is, read once per connection.
func (b *backend) session(ctx context.Context, conn *sql.Conn) (sessionInfo, error) {
	var key any
	_ = conn.Raw(func(dc any) error { key = dc; return nil })
	if v, ok := b.sessions.Load(key); ok {
		return v.(sessionInfo), nil
	}
	var (
		s          sessionInfo
		version    string
		autocommit int64
	)
	b.sent.Add(1)
	if err := conn.QueryRowContext(ctx, connIDSQL).Scan(&s.id, &version, &autocommit); err != nil {
		return sessionInfo{}, err
	}
	s.autocommit = autocommit == 1
	if strings.Contains(strings.ToLower(version), "mariadb") {
		b.mariaDB.Store(1)
	} else {
		b.mariaDB.Store(2)
	}
	if b.nSessions.Add(1) > 4096 {
		// Connections the pool closed are never looked up again; forget
		// them all now and then.
		b.sessions.Clear()
		b.nSessions.Store(1)
	}
	b.sessions.Store(key, s)
	return s, nil
}

// kill ends session (a connection whose request's reply was lost), so that
// the request can run nothing after this returns: a statement the session
// is running is rolled back unless it committed, and one still on its way
// never runs. A session already gone is fine. It reports whether the
// session is known ended (session 0: nothing was sent); false when ctx
// ended first (the server could not be reached).
func (b *backend) kill(ctx context.Context, session uint64) bool {
	if session == 0 {
		return true
	}
	if b.noKill {
		return false
	}
	for attempt := 0; ; attempt++ {
		_, err := b.db.ExecContext(ctx, killSQL+strconv.FormatUint(session, 10))
		if me, ok := serverError(err); err == nil || ok && me.Number == errUnknownThread {
			return true
		}
		if ctx.Err() != nil || !b.pause(ctx, attempt+3) {
			return false
		}
	}
}

// inBackground runs f after its caller's ctx, bounded.
func (b *backend) inBackground(ctx context.Context, f func(ctx context.Context)) {
	if b.background != nil {
		b.background(ctx, f)
		return
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBound)
		defer cancel()
		f(bctx)
	}()
}

// giveBack is the cleanup of a grant attempt of holder that may have run
// unseen: its session is killed, so the request can run nothing more, then
// holder's grant (one handed over included) is released and its queue
// entry taken out. After it returns no grant of that attempt stands, but
// one made by a request whose session could not be killed (the server out
// of reach), which is released again once its deadline late has passed.
func (b *backend) giveBack(ctx context.Context, resource, holder string, err error, late time.Time) {
	var sent *sentError
	session := uint64(0)
	if errors.As(err, &sent) {
		session = sent.session
	}
	b.inBackground(ctx, func(ctx context.Context) {
		if !b.kill(ctx, session) {
			b.late.Note(resource, holder, late)
		}
		for attempt := 0; ; attempt++ {
			_, err := b.release(ctx, "Acquire", resource, holder, true)
			if err == nil || ctx.Err() != nil || !b.pause(ctx, attempt+3) {
				break
			}
		}
		b.giveUp(resource, holder)
	})
}

// Try makes one attempt, in one round trip (see fencekit_lock_grant).
func (b *backend) Try(ctx context.Context, req *lockbackend.Request) (lockbackend.Outcome, error) {
	if req.Owner != "" {
		return lockbackend.Outcome{}, fmt.Errorf("mysqllock: Acquire %q with an owner: %w", req.Resource, lockbackend.ErrUnsupported)
	}
	if err := checkArgs(ctx, "Acquire", req.Resource, req.Holder, req.TTL, true); err != nil {
		return lockbackend.Outcome{}, err
	}
	var life, bellID any
	if req.Queue && b.bell != nil {
		if id := b.bell.id(); id != 0 {
			life, bellID = int(ms(b.life)), int64(id)
		}
	}
	if b.onGrant != nil {
		b.onGrant(req.Holder)
	}
	var kind, token, rem, place, ref sql.NullInt64
	for tries := 1; ; tries++ {
		// The grant's deadline: the caller's, or the grant window from now.
		late := time.Now().Add(b.window)
		if d, ok := ctx.Deadline(); ok && d.Before(late) {
			late = d
		}
		var until any // NULL: no deadline (a control of the tests)
		if !b.noDeadline {
			at, err := b.serverDeadline(ctx, late)
			if err != nil {
				return lockbackend.Outcome{}, translate(ctx, "Acquire", req.Resource, err)
			}
			until = at
		}
		var unkilled bool
		if !b.noFast {
			stmt := fmt.Sprintf(b.fastGrant, literal(req.Resource), literal(req.Holder), nowSQL, ms(req.TTL), ms(b.retention), untilSQL(until))
			n, token, err := b.exec(ctx, &unkilled, stmt)
			if unkilled {
				b.late.Note(req.Resource, req.Holder, late)
			}
			switch {
			case err == nil && n == 1 && token > 0:
				return lockbackend.Outcome{
					Granted: true,
					Hold:    hold{req.Resource, req.Holder},
					Token:   fence.Token(token),
					Holder:  req.Holder,
					Known:   req.TTL,
				}, nil
			case err != nil && !errors.Is(err, errNoFastPath):
				return lockbackend.Outcome{}, b.tryFailed(ctx, req, translate(ctx, "Acquire", req.Resource, err), late)
			}
		}
		stmt := callSQL(grantProc, req.Resource, req.Holder, ms(req.TTL), ms(b.retention), life, req.Ordered, bellID, until)
		err := b.callTracked(ctx, &unkilled, stmt, &kind, &token, &rem, &place, &ref)
		if unkilled {
			b.late.Note(req.Resource, req.Holder, late)
		}
		if err != nil {
			return lockbackend.Outcome{}, b.tryFailed(ctx, req, translate(ctx, "Acquire", req.Resource, err), late)
		}
		if kind.Int64 != replyTooLate {
			break
		}
		// The server reached the request past its deadline and changed
		// nothing: send it again while the caller waits.
		if cerr := ctx.Err(); cerr != nil {
			return lockbackend.Outcome{}, fmt.Errorf("mysqllock: Acquire %q: %w", req.Resource, cerr)
		}
		if tries >= tooLateTries {
			return lockbackend.Outcome{}, fmt.Errorf("mysqllock: Acquire %q: the server reached the grant after its deadline %d times (is its clock stepping back?)", req.Resource, tries)
		}
	}
	remaining := time.Duration(rem.Int64) * time.Millisecond
	switch kind.Int64 {
	case replyRefused:
		o := lockbackend.Outcome{Remaining: remaining, Place: -1}
		if place.Valid && ref.Valid {
			o.Place, o.Ref = place.Int64, ref.Int64
		}
		return o, nil
	case replyGranted, replyHeld:
		if token.Int64 < 1 {
			return lockbackend.Outcome{}, fmt.Errorf("mysqllock: Acquire %q: the server granted no token", req.Resource)
		}
		known := req.TTL
		if kind.Int64 == replyHeld {
			// Counted from the server's statement, after the try was
			// sent: no more than the server holds.
			known = min(remaining, req.TTL)
		}
		return lockbackend.Outcome{
			Granted:     true,
			Hold:        hold{req.Resource, req.Holder},
			Token:       fence.Token(token.Int64),
			Holder:      req.Holder,
			Known:       known,
			HandedOver:  kind.Int64 == replyHeld && req.Queue,
			StateMissed: kind.Int64 == replyGranted && place.Valid && place.Int64 == 1,
		}, nil
	}
	return lockbackend.Outcome{}, fmt.Errorf("mysqllock: Acquire %q: unknown reply kind %d", req.Resource, kind.Int64)
}

// tryFailed is Try's error err: when the grant may have been made, it is
// undone (its session killed, then released, the queue entry with it).
func (b *backend) tryFailed(ctx context.Context, req *lockbackend.Request, err error, late time.Time) error {
	if ctx.Err() != nil || mayHaveRun(err) {
		b.giveBack(ctx, req.Resource, req.Holder, err, late)
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, err)
		}
	}
	return err
}

// hold is a grant's record: what Extend, Release and TTL send.
type hold struct {
	resource, holder string
}

// unknown marks an error of a call whose request may have run.
func unknown(ctx context.Context, err error) error {
	if ctx.Err() == nil && mayHaveRun(err) && !errors.Is(err, lockbackend.ErrReplyLost) {
		return fmt.Errorf("%w: %w", lockbackend.ErrReplyLost, err)
	}
	return err
}

// release frees resource if holder holds it (leaving: and takes holder's
// queue entry out), handing it to the first live waiter in the same
// transaction. It reports whether holder held it.
func (b *backend) release(ctx context.Context, op, resource, holder string, leaving bool) (bool, error) {
	if err := checkArgs(ctx, op, resource, holder, 0, false); err != nil {
		return false, err
	}
	if !leaving && !b.noFast {
		n, _, err := b.exec(ctx, nil, fmt.Sprintf(b.fastRel, literal(resource), literal(holder), nowSQL, ms(b.retention)))
		switch {
		case err == nil && n == 1:
			return true, nil
		case err != nil && !errors.Is(err, errNoFastPath):
			return false, translate(ctx, op, resource, err)
		}
	}
	var held sql.NullInt64
	if err := b.call(ctx, callSQL(releaseProc, resource, holder, ms(b.retention), leaving), &held); err != nil {
		return false, translate(ctx, op, resource, err)
	}
	return held.Int64 == 1, nil
}

// Extend lengthens the lease, never shortening it; the answer, counted on
// the server after the call was sent, is no more than the server holds.
func (b *backend) Extend(ctx context.Context, h lockbackend.Hold, ttl time.Duration) (time.Duration, error) {
	hd := h.(hold)
	if err := checkArgs(ctx, "Extend", hd.resource, hd.holder, ttl, true); err != nil {
		return 0, err
	}
	var rem sql.NullInt64
	if err := b.call(ctx, callSQL(extendProc, hd.resource, hd.holder, ms(ttl), ms(b.retention)), &rem); err != nil {
		return 0, unknown(ctx, translate(ctx, "Extend", hd.resource, err))
	}
	if rem.Int64 == notHeld {
		return 0, fmt.Errorf("mysqllock: Extend %q: %w", hd.resource, lock.ErrNotHeld)
	}
	return time.Duration(rem.Int64) * time.Millisecond, nil
}

// Release frees the lock, handing it to the first live waiter.
func (b *backend) Release(ctx context.Context, h lockbackend.Hold) error {
	hd := h.(hold)
	held, err := b.release(ctx, "Release", hd.resource, hd.holder, false)
	b.giveUp(hd.resource, hd.holder)
	if err != nil {
		return unknown(ctx, err)
	}
	if !held {
		return fmt.Errorf("mysqllock: Release %q: %w", hd.resource, lockbackend.ErrNotHeld)
	}
	return nil
}

// TTL reads what is left of the lease on the server.
func (b *backend) TTL(ctx context.Context, h lockbackend.Hold) (time.Duration, error) {
	hd := h.(hold)
	if err := checkArgs(ctx, "TTL", hd.resource, hd.holder, 0, false); err != nil {
		return 0, err
	}
	var rem sql.NullInt64
	if err := b.call(ctx, callSQL(ttlProc, hd.resource, hd.holder), &rem); err != nil {
		return 0, translate(ctx, "TTL", hd.resource, err)
	}
	if rem.Int64 == notHeld {
		return 0, fmt.Errorf("mysqllock: TTL %q: %w", hd.resource, lock.ErrNotHeld)
	}
	return time.Duration(rem.Int64) * time.Millisecond, nil
}

// Abandon releases what an attempt of holder may have left (a grant, one
// handed over, its queue entry), in one round trip.
func (b *backend) Abandon(ctx context.Context, resource, holder, acq string) error {
	if acq != "" {
		return fmt.Errorf("mysqllock: Abandon %q with an owner's hold: %w", resource, lockbackend.ErrUnsupported)
	}
	_, err := b.release(ctx, "Acquire", resource, holder, true)
	b.giveUp(resource, holder)
	return err
}

// Advance raises resource's token counter to at least atLeast.
func (b *backend) Advance(ctx context.Context, resource string, atLeast fence.Token) error {
	if err := checkArgs(ctx, "Advance", resource, "-", 0, false); err != nil {
		return err
	}
	if atLeast < 1 || atLeast > fence.MaxToken {
		return invalid("Advance %q: token %d out of range", resource, atLeast)
	}
	var n sql.NullInt64
	if err := b.call(ctx, callSQL(advanceProc, resource, int64(atLeast), ms(b.retention)), &n); err != nil {
		return translate(ctx, "Advance", resource, err)
	}
	return nil
}

// Close stops the doorbell and the reclaimer, and waits for background
// cleanups until deadline at most.
func (b *backend) Close(deadline time.Time) {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.once.Do(func() { close(b.stop) })
	done := make(chan struct{})
	go func() {
		if b.bell != nil {
			b.bell.close()
		}
		b.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
	}
}

// reclaim deletes up to max rows of idle resources whose retention has
// passed, and long-lapsed queue entries; it returns how many lock rows went.
func (b *backend) reclaim(ctx context.Context, max int) (int, error) {
	var n sql.NullInt64
	if err := b.call(ctx, callSQL(reclaimProc, max), &n); err != nil {
		return 0, translate(ctx, "reclaim", "*", err)
	}
	return int(n.Int64), nil
}

// reclaimLoop reclaims idle rows every period until the backend closes.
func (b *backend) reclaimLoop(period time.Duration) {
	defer b.bg.Done()
	lockbackend.ReclaimEvery(b.stop, period, reclaimBatch, b.reclaim)
}
