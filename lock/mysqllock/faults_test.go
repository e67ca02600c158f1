package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// lateProxy forwards connections to a MySQL server and can hold the next
// request a client sends for a while before it delivers it, even if the
// client has closed its connection meanwhile, as the network delivers a
// request already sent: the server then runs a request whose caller gave
// up long ago.
type lateProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	hold   time.Duration
	match  func([]byte) bool // which request to hold; nil: any
	held   int
	down   time.Time // until then every other request is dropped with its connection
}

func startLateProxy(t testing.TB, target string) *lateProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lateProxy{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

// holdNext holds the next request of any client for d.
func (p *lateProxy) holdNext(d time.Duration) { p.holdNextMatching(d, nil) }

// holdNextMatching holds the next request for which match reports true
// for d.
func (p *lateProxy) holdNextMatching(d time.Duration, match func([]byte) bool) {
	p.mu.Lock()
	p.hold, p.match = d, match
	p.mu.Unlock()
}

// cutOthers makes the network drop, for d, every request but the held
// one, and reset its connection, as a link that went down would for
// requests not yet on their way: a cleanup cannot reach the server meanwhile.
func (p *lateProxy) cutOthers(d time.Duration) {
	p.mu.Lock()
	p.down = time.Now().Add(d)
	p.mu.Unlock()
}

// isDown reports whether requests are being dropped.
func (p *lateProxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.down)
}

func (p *lateProxy) take(req []byte) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.hold
	if d > 0 && (p.match == nil || p.match(req)) {
		p.hold, p.match = 0, nil
		p.held++
		return d
	}
	return 0
}

func (p *lateProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	go func() {
		_, _ = io.Copy(c, s)
		_ = c.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if d := p.take(buf[:n]); d > 0 {
				time.Sleep(d)
			} else if p.isDown() {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				_ = c.Close()
				break
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	// The server reads what was delivered before it sees the end.
	time.Sleep(200 * time.Millisecond)
	_ = s.Close()
}

// lateGrant runs a TryAcquire whose request is held in the network for
// 1s, past its caller's 200ms deadline and past the cleanup that
// follows, then delivered, and reports whether that grant stands (the row
// names its holder with a live lease) once it has run.
//
// retried: the client's read timeout (300ms) gives up on the held
// request's connection instead, the lock sends the grant again on another
// connection, which grants, and the caller releases that grant before the
// first request is delivered.
func lateGrant(t *testing.T, cfg config, retried bool) (stood bool) {
	return lateGrantCut(t, cfg, retried, 0)
}

// lateGrantCut is lateGrant with every other request dropped for cut from
// when the grant's request is held (its cleanup cannot reach the server),
// and the request held until 400ms after that.
func lateGrantCut(t *testing.T, cfg config, retried bool, cut time.Duration) (stood bool) {
	t.Helper()
	mcfg := migratedConfig(t)
	db := testenv.OpenMySQL(t, mcfg.Clone())
	proxy := startLateProxy(t, mcfg.Addr)
	pcfg := mcfg.Clone()
	pcfg.Addr = proxy.ln.Addr().String()
	if retried {
		pcfg.ReadTimeout = 300 * time.Millisecond
	}
	pdb := testenv.OpenMySQL(t, pcfg)
	ctx := ctxFor(t, 60*time.Second)
	l, err := newWith(pdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	warm, err := l.TryAcquire(ctx, "late", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := time.Second
	if cut > 0 {
		held = cut + 400*time.Millisecond
		proxy.cutOthers(cut)
	}
	proxy.holdNext(held)
	if retried {
		lease, err := l.TryAcquire(ctx, "late", 20*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire whose first request was held: %v", err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	} else {
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = l.TryAcquire(tctx, "late", 20*time.Second)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire held in the network = %v, want its deadline", err)
		}
	}
	time.Sleep(held + 800*time.Millisecond)
	var holder sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT holder FROM fencekit_lock WHERE resource = 'late'
        AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`).Scan(&holder); err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return holder.Valid
}

// TestLateGrantNeverStands: a grant whose caller gave up while its
// request was still in the network, delivered after the caller's cleanup,
// never stands: the cleanup kills the request's session first, so the
// request can run nothing when it arrives (and a grant's deadline, the
// caller's here, is passed by then). The control without the kill and the
// deadline lets the late grant stand for its whole 20s TTL under a holder
// nobody has. The same when the lock itself gave up on the request and sent it
// again: the retry grants, the caller releases, and the first request,
// delivered after, grants nothing.
func TestLateGrantNeverStands(t *testing.T) {
	t.Parallel() // mostly waits for the held request
	for _, retried := range []bool{false, true} {
		if lateGrant(t, config{}, retried) {
			t.Fatalf("retried %v: the grant of a caller that gave up stands", retried)
		}
		if !lateGrant(t, config{noKill: true, noDeadline: true}, retried) {
			t.Fatalf("retried %v: control: without the kill and the deadline the late grant did not stand: the test cannot see the defect", retried)
		}
	}
}

// TestLateGrantPastAnUnreachableCleanup: the grant's request is held in
// the network while every other request is dropped for longer than the
// cleanup lasts (a link down: the cleanup's KILL cannot reach the server),
// then delivered. The server reaches it past its deadline and grants
// nothing. Without the deadline (the control, the code before migration
// 00006) the grant stands for its whole 20s TTL.
// The grant goes out as the fast path's UPDATE, and, in its second case,
// as the procedure's CALL.
func TestLateGrantPastAnUnreachableCleanup(t *testing.T) {
	t.Parallel() // mostly waits for the held request
	cut := cleanupBound + 600*time.Millisecond
	for _, procedure := range []bool{false, true} {
		t.Run(fmt.Sprintf("procedure=%v", procedure), func(t *testing.T) {
			t.Parallel()
			if lateGrantCut(t, config{noFast: procedure}, false, cut) {
				t.Fatal("the grant of a caller that gave up stands, delivered after its cleanup could not reach the server")
			}
			if !lateGrantCut(t, config{noFast: procedure, noDeadline: true}, false, cut) {
				t.Fatal("control: without the deadline the late grant did not stand: the test cannot see the defect")
			}
		})
	}
}

// TestSessionDefaults: the lock is correct whatever the session's
// defaults, set through the DSN on the user's own *sql.DB: autocommit off
// (every grant through the procedures), SIMULTANEOUS_ASSIGNMENT,
// SERIALIZABLE, a hostile sql_mode, a lock wait timeout of 0 (fail at
// once) and a statement timeout of 5ms. 8 Lockers x 15 rounds of Acquire,
// a check that nobody else holds, and Release give no error.
func TestSessionDefaults(t *testing.T) {
	for _, params := range []map[string]string{
		{"autocommit": "0", "tx_isolation": "'SERIALIZABLE'"},
		{"autocommit": "0", "tx_isolation": "'REPEATABLE-READ'"},
		{"tx_isolation": "'READ-UNCOMMITTED'", "sql_mode": "'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT,ANSI,SIMULTANEOUS_ASSIGNMENT'"},
		{"innodb_lock_wait_timeout": "0", "max_statement_time": "0.005"},
	} {
		t.Run(fmt.Sprint(params), func(t *testing.T) {
			cfg := migratedConfig(t)
			cfg.Params = params
			db := testenv.OpenMySQL(t, cfg)
			ctx := ctxFor(t, 120*time.Second)
			var (
				wg      sync.WaitGroup
				inside  atomic.Int32
				errs    atomic.Int32
				overlap atomic.Int32
			)
			for range 8 {
				l := newLocker(t, db)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 15 {
						lease, err := l.Acquire(ctx, "defaults", 10*time.Second)
						if err != nil {
							t.Error(err)
							errs.Add(1)
							return
						}
						if inside.Add(1) != 1 {
							overlap.Add(1)
						}
						inside.Add(-1)
						if err := lease.Release(ctx); err != nil {
							t.Error(err)
							errs.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if errs.Load() != 0 || overlap.Load() != 0 {
				t.Fatalf("%d errors, %d overlapping holds", errs.Load(), overlap.Load())
			}
		})
	}
}

// TestKillLockConnection: KILL of the sessions of a Locker (its pool's and
// its doorbell's) loses no lease and leaves no error behind: the next
// statement goes out on a new connection, and a waiter still gets the
// lock handed over.
func TestKillLockConnection(t *testing.T) {
	db := migrated(t)
	ctx := ctxFor(t, 60*time.Second)
	a, b := newLocker(t, db), newLocker(t, db)
	lease, err := a.TryAcquire(ctx, "killed", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(ctx, "killed", 20*time.Second)
		if err == nil {
			err = lb.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, func() bool {
		var c int
		_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM fencekit_lock_waiter WHERE resource = 'killed'`).Scan(&c)
		return c == 1
	})
	killAll(t, db)
	if err := lease.Extend(ctx, 20*time.Second); err != nil {
		t.Fatalf("Extend after KILL: %v", err)
	}
	killAll(t, db)
	start := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after KILL: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not handed the lock after its doorbell was killed")
	}
	t.Logf("hand-over after the doorbell's KILL: %v", time.Since(start))
}

// killAll kills every session of the test's database but the one that
// kills.
func killAll(t testing.TB, db *sql.DB) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer discard(conn)
	rows, err := conn.QueryContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	for _, id := range ids {
		_, _ = conn.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
	}
}

// TestCallsEndByContext: against a server that stopped answering (the
// proxy holds every byte), every call returns by its context's deadline,
// with an error matching it.
func TestCallsEndByContext(t *testing.T) {
	cfg := migratedConfig(t)
	proxy := testenv.StartProxy(t, cfg.Addr)
	pcfg := cfg.Clone()
	pcfg.Addr = proxy.Addr()
	db := testenv.OpenMySQL(t, pcfg)
	l := newLocker(t, db)
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.TryAcquire(ctx, "silent", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	defer proxy.Unblock()
	calls := map[string]func(context.Context) error{
		"TryAcquire": func(ctx context.Context) error { _, err := l.TryAcquire(ctx, "silent-2", time.Second); return err },
		"Acquire":    func(ctx context.Context) error { _, err := l.Acquire(ctx, "silent", time.Second); return err },
		"Extend":     func(ctx context.Context) error { return lease.Extend(ctx, 20*time.Second) },
		"TTL":        func(ctx context.Context) error { _, err := lease.TTL(ctx); return err },
		"Release":    func(ctx context.Context) error { return lease.Release(ctx) },
	}
	for name, call := range calls {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		err := call(cctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s against a silent server = %v, want its deadline", name, err)
		}
		if took > 5*time.Second {
			t.Errorf("%s returned %v after its 300ms deadline", name, took)
		}
	}
}

// TestCrashKeepsLeases: the tables are InnoDB, so a lease granted before
// the server is killed (SIGKILL) stands after its crash recovery: another
// Locker is refused, the holder extends and releases it on new
// connections, and the next token is above it.
func TestCrashKeepsLeases(t *testing.T) {
	testenv.Slow(t)
	t.Parallel() // a private server of its own
	srv := testenv.StartMySQL(t)
	db := testenv.OpenMySQL(t, srv.Config())
	ctx := ctxFor(t, 2*time.Minute)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	a, b := newLocker(t, db), newLocker(t, db)
	lease, err := a.TryAcquire(ctx, "crash", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	var na *lock.NotAcquiredError
	if _, err := b.TryAcquire(ctx, "crash", time.Second); !errors.As(err, &na) {
		t.Fatalf("TryAcquire after the crash = %v, want the lease granted before it to stand", err)
	}
	if err := lease.Extend(ctx, 30*time.Second); err != nil {
		t.Fatalf("Extend after the crash: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after the crash: %v", err)
	}
	next, err := b.TryAcquire(ctx, "crash", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence().Token <= lease.Fence().Token {
		t.Fatalf("token %d after the crash, not above %d", next.Fence().Token, lease.Fence().Token)
	}
	_ = next.Release(ctx)
}
