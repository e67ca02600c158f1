package mysqllock

import (
	"bytes"
	"context"
	"database/sql"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The late-grant model on MariaDB: a workload on one resource, in a
// database of its own, with the actors' sessions' defaults
// (transaction_isolation, max_statement_time, innodb_lock_wait_timeout,
// lock_wait_timeout, wait_timeout) drawn from the seed, under two
// nemeses: a grant's request held in the network past its caller's
// deadline, or past a retry (its connection reset, the retry granted and
// released), then delivered; and the same while the late actor's link is
// down for longer than a cleanup lasts (its KILL reaches the server only
// after the request). Judged: every observation of the lock granted to a
// holder whose caller had given up, or had released it, must come less
// than lateBound after its caller was done (the grant window of the run,
// the cleanup's bound, a loaded machine).
//
// The control (noKill and noDeadline: grants carry no deadline and no
// session is killed, the cleanup only releases) must be rejected: a
// request held past its TryAcquire's deadline lands after the release and
// holds the lock for its whole lease, longer than lateBound.

const (
	// lateWindow is the grant window of the model's Lockers (grantWindow
	// is 5s; shorter here, to keep the run short).
	lateWindow = time.Second
	// lateBound bounds how long a grant stands after its caller was done:
	// its deadline (at most lateWindow after the send), then the release
	// of the cleanup (within cleanupBound).
	lateBound = lateWindow + cleanupBound + time.Second
	// lateTTL is the lease the late requests ask for: above lateBound, so
	// an orphan that stands for its lease is seen.
	lateTTL = 7 * time.Second
)

// Kinds of judgment of the late-grant model.
const (
	lateHeld      = "observations of the lock held, judged for orphans"
	lateOrphans   = "observations of a holder whose caller was done"
	lateDelivered = "requests held past their caller"
	lateGaveUp    = "calls given up or released, followed"
	latePartition = "late requests held across a link down"
)

// lateModel is one run's state.
type lateModel struct {
	r *lockmodel.Result

	mu    sync.Mutex
	dead  map[string]time.Time // holder -> when its caller was done with it
	cur   map[int]string       // actor -> holder id of its call in flight
	whose map[string]int       // holder -> actor
	worst map[string]time.Duration
}

func (m *lateModel) seen(actor int) func(string) {
	return func(h string) {
		m.mu.Lock()
		m.cur[actor] = h
		m.whose[h] = actor
		m.mu.Unlock()
	}
}

// done records that actor's call (its holder id as last sent) is over,
// or that holder's lease was released.
func (m *lateModel) done(actor int, holder string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if holder == "" {
		holder = m.cur[actor]
	}
	if holder == "" {
		return
	}
	if _, ok := m.dead[holder]; !ok {
		m.dead[holder] = time.Now()
		m.r.Add(lateGaveUp, 1)
	}
}

func TestLockModelMySQLLateGrants(t *testing.T) {
	testenv.Slow(t)
	t.Parallel() // mostly waits for held requests
	r := runLateModel(t, "late", config{})
	r.Report(t)
	r.Check(t, map[string]int{lateHeld: 50, lateOrphans: 0, lateDelivered: 3, lateGaveUp: 10, latePartition: 1})
}

// TestLockModelMySQLLateGrantsControl: the model rejects the lock whose
// cleanup neither kills the request's session nor outlasts its deadline
// (the cleanup only releases), and the lock whose grants carry no deadline
// (the code before migration 00006: the KILL alone, which a cleanup that
// cannot reach the server never sends).
func TestLockModelMySQLLateGrantsControl(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  config
	}{
		{"no kill, no deadline", config{noKill: true, noDeadline: true}},
		{"no deadline", config{noDeadline: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runLateModel(t, "late control: "+c.name, c.cfg)
			r.Report(t)
			rejected := 0
			if r.Rejected(lateOrphans) {
				rejected = 1
			}
			lockmodel.LogControl(t, rejected, 1)
			if rejected == 0 {
				t.Fatalf("the control (%s) was not rejected: %d observations of orphans judged", c.name, r.Count(lateOrphans))
			}
		})
	}
}

// isGrantOf matches a request that grants resource: the fast path's
// UPDATE or the procedure's CALL, whose resource comes first as a literal.
func isGrantOf(resource string) func([]byte) bool {
	lit := []byte(literal(resource))
	return func(req []byte) bool {
		i := bytes.Index(req, lit)
		if i < 0 || i+len(lit) >= len(req) || req[i+len(lit)] != ' ' && req[i+len(lit)] != ',' {
			return false
		}
		return bytes.Contains(req, []byte("CALL "+grantProc+"(")) || bytes.Contains(req, []byte("token = LAST_INSERT_ID("))
	}
}

// lateSessionDefaults draws the actors' session defaults of a run.
func lateSessionDefaults(rng *rand.Rand) map[string]string {
	params := map[string]string{
		"tx_isolation": []string{"'READ-COMMITTED'", "'REPEATABLE-READ'", "'SERIALIZABLE'"}[rng.IntN(3)],
	}
	if rng.IntN(2) == 0 {
		params["max_statement_time"] = "0.5"
	}
	if rng.IntN(2) == 0 {
		params["innodb_lock_wait_timeout"] = "1"
		params["lock_wait_timeout"] = "2"
	}
	if rng.IntN(2) == 0 {
		// Above the longest hold of a request (2.6s): a session the
		// server ends while its request is held runs nothing.
		params["wait_timeout"] = "4"
	}
	return params
}

// runLateModel runs the model on Lockers made with broken (a control's
// hooks; zero for the lock as it is), labelled label.
func runLateModel(t *testing.T, label string, broken config) *lockmodel.Result {
	control := broken.noKill || broken.noDeadline
	seed := lockmodel.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	params := lateSessionDefaults(rng)
	r := lockmodel.NewResult("mysql", label, seed)
	t.Logf("session defaults of this run: %v", params)
	cfg := migratedConfig(t)
	observer := testenv.OpenMySQL(t, cfg.Clone())
	m := &lateModel{r: r, dead: map[string]time.Time{}, cur: map[int]string{}, whose: map[string]int{}, worst: map[string]time.Duration{}}
	const (
		resource    = "late"
		cutResource = "late-cut"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	lockerFor := func(addr string, actor int) *lock.Locker {
		c := cfg.Clone()
		c.Addr = addr
		c.Params = params
		if addr != cfg.Addr {
			// The late actor's client gives up on a held request and the
			// lock sends it again on another connection.
			c.ReadTimeout = 300 * time.Millisecond
		}
		conn, err := mysql.NewConnector(c)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { _ = db.Close() })
		l, err := newWith(db, config{onGrant: m.seen(actor), window: lateWindow, noKill: broken.noKill, noDeadline: broken.noDeadline},
			lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	proxy := startLateProxy(t, cfg.Addr)
	budget := lockmodel.Budget(t) + 3*time.Second
	end := time.Now().Add(budget)
	var wg sync.WaitGroup

	// Three actors, direct: short deadlines, short holds.
	for a := range 3 {
		l := lockerFor(cfg.Addr, a)
		arng := rand.New(rand.NewPCG(seed, uint64(a)))
		wg.Go(func() {
			for time.Now().Before(end) {
				cctx, stop := context.WithTimeout(ctx, time.Duration(1+arng.IntN(300))*time.Millisecond)
				ttl := time.Duration(200+arng.IntN(800)) * time.Millisecond
				var (
					ls  *lock.Lease
					err error
				)
				if arng.IntN(2) == 0 {
					ls, err = l.TryAcquire(cctx, resource, ttl)
				} else {
					ls, err = l.Acquire(cctx, resource, ttl)
				}
				stop()
				if err != nil || ls == nil {
					m.done(a, "")
					time.Sleep(time.Duration(arng.IntN(40)) * time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(arng.IntN(30)) * time.Millisecond)
				rctx, stop := context.WithTimeout(ctx, 2*time.Second)
				_ = ls.Release(rctx)
				stop()
				m.done(a, ls.Fence().Holder)
				time.Sleep(time.Duration(20+arng.IntN(80)) * time.Millisecond)
			}
		})
	}

	// The late actor, through the proxy: a TryAcquire that gives up at
	// 200ms while its request is held for 0.3-1.5s; one whose client gives
	// up on the held request at its read timeout (300ms), so the lock
	// kills that session and sends the grant again, which is granted and
	// released at once; and one held for 2.6s while the proxy drops every
	// other request for 3s (the cleanup's KILL and release cannot reach
	// the server before the request lands).
	late := lockerFor(proxy.ln.Addr().String(), 3)
	wg.Go(func() {
		lrng := rand.New(rand.NewPCG(seed, 99))
		for i := 0; time.Now().Before(end); i++ {
			kind := i % 3
			// Warm a connection, so that the held request is the grant's
			// (and the row of the resource nobody else locks, so that the
			// fast path's UPDATE finds it).
			warm := "late-warm"
			if kind == 2 {
				warm = cutResource
			}
			if ls, err := late.TryAcquire(ctx, warm, time.Second); err == nil {
				_ = ls.Release(ctx)
			}
			d, wait := 200*time.Millisecond, time.Duration(300+lrng.IntN(1200))*time.Millisecond
			switch kind {
			case 1:
				d = 5 * time.Second
			case 2:
				wait = 2600 * time.Millisecond
				proxy.cutOthers(3 * time.Second)
				r.Add(latePartition, 1)
			}
			res := resource
			if kind == 2 {
				res = cutResource // nobody else's: the late grant finds it free
			}
			proxy.holdNextMatching(wait, isGrantOf(res))
			cctx, stop := context.WithTimeout(ctx, d)
			ls, err := late.TryAcquire(cctx, res, lateTTL)
			stop()
			if err == nil {
				_ = ls.Release(ctx)
				m.done(3, ls.Fence().Holder)
			} else {
				m.done(3, "")
			}
			if kind == 2 {
				time.Sleep(3100 * time.Millisecond)
			}
			time.Sleep(time.Duration(200+lrng.IntN(300)) * time.Millisecond)
		}
	})

	// The observer: judges every observation of a holder whose caller is
	// done.
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for time.Now().Before(end.Add(lateTTL)) {
			sent := time.Now()
			rows, err := observer.QueryContext(ctx, `SELECT holder FROM fencekit_lock WHERE resource IN (?, ?) AND expires_us > `+nowSQL, resource, cutResource)
			var holders []string
			for err == nil && rows.Next() {
				var h sql.NullString
				if err = rows.Scan(&h); err == nil && h.Valid {
					holders = append(holders, h.String)
				}
			}
			if rows != nil {
				rows.Close()
			}
			if err != nil {
				r.Add("observations failed", 1)
			}
			for _, h := range holders {
				r.Add(lateHeld, 1)
				m.mu.Lock()
				since, dead := m.dead[h]
				actor := m.whose[h]
				m.mu.Unlock()
				if dead && sent.After(since) {
					r.Add(lateOrphans, 1)
					age := sent.Sub(since)
					if age > lateBound && m.worst[h] <= lateBound {
						r.Violate(lateOrphans, "the lock stood granted to %s (actor %d) %v after its caller was done (bound %v)", h[:8], actor, age.Round(time.Millisecond), lateBound)
					}
					m.worst[h] = max(m.worst[h], age)
				}
			}
			if time.Now().After(end) && !control {
				break
			}
			if control && r.Rejected(lateOrphans) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	<-obsDone
	var worst time.Duration
	for _, d := range m.worst {
		worst = max(worst, d)
	}
	t.Logf("the longest a lock was seen granted to a holder whose caller was done: %v (bound %v)", worst.Round(time.Millisecond), lateBound)
	proxy.mu.Lock()
	r.Add(lateDelivered, proxy.held)
	proxy.mu.Unlock()
	return r
}
