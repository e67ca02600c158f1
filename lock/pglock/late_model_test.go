package pglock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The late-grant model: a workload on one resource, in a database of its
// own whose defaults (default_transaction_isolation, statement_timeout,
// lock_timeout, idle_session_timeout) are drawn from the seed, under
// three nemeses: a grant's request held in the network past its caller's
// deadline and then delivered; the same past a retry (the first request's
// connection reset, the retry granted and released); and a waiter's LISTEN
// connection gone silent without FIN or RST. Judged beside the lock model's
// promises:
//
//   - orphans: every observation of the lock granted to a holder whose
//     caller had given up, or had released it, is judged: such a grant
//     must not stand longer than lateBound after its caller was done (the
//     grant window of the run, the void's round trip, a loaded machine);
//   - hand-over latency while the waiter's listener is silent: at most
//     silentBound from the release to the waiter's grant.
//
// The control (noVoid: grants carry no deadline and nobody voids them,
// the code before migration 00012) must be rejected: a request held past
// its TryAcquire's deadline lands on a free lock and holds it for its
// whole lease, longer than lateBound.

const (
	// lateWindow is the grant window of the model's Lockers (grantWindow
	// is 5s; shorter here, to keep the run short).
	lateWindow = time.Second
	// lateBound bounds how long a grant stands after its caller was done.
	lateBound = lateWindow + 2*time.Second
	// lateTTL is the lease the late requests ask for: above lateBound, so
	// an orphan that stands for its lease is seen.
	lateTTL = 6 * time.Second
	// silentBound bounds a hand-over to a waiter whose listener is silent:
	// its queue refresh (1s) or the listener's replacement, on a loaded
	// machine.
	silentBound = 6 * time.Second
)

// Kinds of judgment of the late-grant model.
const (
	lateHeld      = "observations of the lock held, judged for orphans"
	lateOrphans   = "observations of a holder whose caller was done"
	lateDelivered = "late requests delivered"
	lateGaveUp    = "calls given up or released, followed"
	lateHandOvers = "hand-overs while the listener was silent"
)

// lateModel is one run's state.
type lateModel struct {
	r        *lockmodel.Result
	resource string

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

// tracer tells the model each grant's holder id as it is sent.
type lateTracer struct{ seen func(string) }

func (s lateTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isGrantSQL(d.SQL) && len(d.Args) > 1 {
		if h, ok := d.Args[1].(string); ok {
			s.seen(h)
		}
	}
	return ctx
}

func (lateTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestLockModelPostgresLateGrants(t *testing.T) {
	testenv.Slow(t)
	r := runLateModel(t, false)
	r.Report(t)
	r.Check(t, map[string]int{lateHeld: 50, lateOrphans: 0, lateDelivered: 2, lateGaveUp: 10, lateHandOvers: 1})
}

// TestLockModelPostgresLateGrantsControl: the model rejects the lock
// whose cleanup is not ordered after the grant in flight.
func TestLockModelPostgresLateGrantsControl(t *testing.T) {
	testenv.Slow(t)
	r := runLateModel(t, true)
	r.Report(t)
	rejected := 0
	if r.Rejected(lateOrphans) {
		rejected = 1
	}
	lockmodel.LogControl(t, rejected, 1)
	if rejected == 0 {
		t.Fatalf("the control (no deadline, no void) was not rejected: %d observations of orphans judged", r.Count(lateOrphans))
	}
}

// silentHandOver has holder take the hand-over resource, waiter queue for
// it, the waiter's listener connections go silent (no FIN, no RST), and
// holder release: it returns the time from the release to the waiter's
// grant.
func silentHandOver(ctx context.Context, holder, waiter *lock.Locker, silent *testenv.Proxy) (time.Duration, error) {
	hs, err := holder.Acquire(ctx, "late-handover", 20*time.Second)
	if err != nil {
		return 0, fmt.Errorf("the holder of the hand-over: %w", err)
	}
	got := make(chan error, 1)
	var granted time.Time
	go func() {
		ws, err := waiter.Acquire(ctx, "late-handover", time.Second)
		granted = time.Now()
		if err == nil {
			_ = ws.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // queued, listener up
	silent.SilenceOpen()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := hs.Release(ctx); err != nil {
		return 0, fmt.Errorf("the holder's release: %w", err)
	}
	if err := <-got; err != nil {
		return 0, fmt.Errorf("the waiter: %w", err)
	}
	return granted.Sub(released), nil
}

func runLateModel(t *testing.T, control bool) *lockmodel.Result {
	seed := lockmodel.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	settings := map[string]string{
		"default_transaction_isolation": []string{"read committed", "repeatable read", "serializable"}[rng.IntN(3)],
	}
	if rng.IntN(2) == 0 {
		settings["lock_timeout"] = "200ms"
	}
	if rng.IntN(2) == 0 {
		settings["statement_timeout"] = "500ms"
	}
	if rng.IntN(2) == 0 {
		// Above the longest hold of a request (1.5s): a session the
		// server ends while its request is held runs nothing, and the
		// control would go unseen.
		settings["idle_session_timeout"] = "3s"
	}
	label := "late"
	if control {
		label = "late control"
	}
	r := lockmodel.NewResult("postgres", label, seed)
	t.Logf("database defaults of this run: %v", settings)
	pool := databaseWith(t, settings)
	m := &lateModel{r: r, resource: "late", dead: map[string]time.Time{}, cur: map[int]string{}, whose: map[string]int{}, worst: map[string]time.Duration{}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	edit := func(c *config) {
		c.window = lateWindow
		c.noVoid = control
	}
	poolFor := func(u string, actor int, max int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = max
		cfg.ConnConfig.Tracer = lateTracer{m.seen(actor)}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	dbURL := pool.Config().ConnString()
	lateProxy := testenv.StartProxy(t, hostPort(t, pool))
	lateURL := strings.Replace(dbURL, hostPort(t, pool), lateProxy.Addr(), 1)
	budget := lockmodel.Budget(t) + 2*time.Second
	end := time.Now().Add(budget)
	var wg sync.WaitGroup

	// Three actors on the pool, direct: short deadlines, short holds.
	for a := range 3 {
		l, err := newWithConfig(poolFor(dbURL, a, 4), nil, edit)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		arng := rand.New(rand.NewPCG(seed, uint64(a)))
		wg.Go(func() {
			for time.Now().Before(end) {
				cctx, stop := context.WithTimeout(ctx, time.Duration(1+arng.IntN(300))*time.Millisecond)
				var (
					ls  *lock.Lease
					err error
				)
				if arng.IntN(2) == 0 {
					ls, err = l.TryAcquire(cctx, m.resource, time.Duration(200+arng.IntN(800))*time.Millisecond)
				} else {
					ls, err = l.Acquire(cctx, m.resource, time.Duration(200+arng.IntN(800))*time.Millisecond)
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

	// The late actor, through a proxy that holds its requests: a
	// TryAcquire that gives up at 200ms while its request is held for
	// 0.3-1.5s, or whose connection is reset while its request is held
	// (the retry grants; it releases at once).
	lateLocker, err := newWithConfig(poolFor(lateURL, 3, 2), nil, edit, lock.WithWait(lock.Backoff(5*time.Millisecond, 50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	defer lateLocker.Close()
	wg.Go(func() {
		lrng := rand.New(rand.NewPCG(seed, 99))
		for i := 0; time.Now().Before(end); i++ {
			// Warm the connection (pgx prepares a statement in a round
			// trip of its own the first time).
			if ls, err := lateLocker.TryAcquire(ctx, "late-warm", time.Second); err == nil {
				_ = ls.Release(ctx)
			}
			reset := i%3 == 2
			lateProxy.HoldNextRequest(time.Duration(300+lrng.IntN(1200))*time.Millisecond, reset)
			d := 200 * time.Millisecond
			if reset {
				d = 5 * time.Second
			}
			cctx, stop := context.WithTimeout(ctx, d)
			ls, err := lateLocker.TryAcquire(cctx, m.resource, lateTTL)
			stop()
			if err == nil {
				_ = ls.Release(ctx)
				m.done(3, ls.Fence().Holder)
			} else {
				m.done(3, "")
			}
			time.Sleep(time.Duration(200+lrng.IntN(300)) * time.Millisecond)
		}
	})

	// A holder and a waiter on their own resource; the waiter's listener
	// goes through a proxy that goes silent.
	silentProxy := testenv.StartProxy(t, hostPort(t, pool))
	silentPool := poolFor(strings.Replace(dbURL, hostPort(t, pool), silentProxy.Addr(), 1), 5, 1)
	waiter, err := newWithConfig(poolFor(dbURL, 4, 2), nil, func(c *config) { edit(c); c.listenVia = silentPool })
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	holder, err := newWithConfig(poolFor(dbURL, 6, 2), nil, edit)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var handOvers []time.Duration // release to the waiter's grant, listener silent
	wg.Go(func() {
		// Hand-overs one after another while the run lasts: each silences
		// the waiter's listener connection of the moment (a replacement
		// made since is silenced by the next).
		for first := true; first || time.Now().Add(1500*time.Millisecond).Before(end); first = false {
			d, err := silentHandOver(ctx, holder, waiter, silentProxy)
			if err != nil {
				r.Violate(lateHandOvers, "%v", err)
				return
			}
			r.Add(lateHandOvers, 1)
			if d > silentBound {
				r.Violate(lateHandOvers, "a hand-over took %v with the waiter's listener silent, above %v", d, silentBound)
			}
			m.mu.Lock()
			handOvers = append(handOvers, d)
			m.mu.Unlock()
		}
	})

	// The observer: judges every observation of a holder whose caller is
	// done.
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for time.Now().Before(end.Add(lateTTL)) {
			sent := time.Now()
			orphan := false
			var h *string
			err := pool.QueryRow(ctx, `SELECT holder FROM fencekit_lock WHERE resource = $1 AND expires_at > clock_timestamp()`, m.resource).Scan(&h)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				r.Add("observations failed", 1)
			} else if h != nil {
				r.Add(lateHeld, 1)
				m.mu.Lock()
				since, dead := m.dead[*h]
				actor := m.whose[*h]
				m.mu.Unlock()
				if dead && sent.After(since) {
					orphan = true
					r.Add(lateOrphans, 1)
					age := sent.Sub(since)
					if age > lateBound && m.worst[*h] <= lateBound {
						r.Violate(lateOrphans, "the lock stood granted to %s (actor %d) %v after its caller was done (bound %v)", (*h)[:8], actor, age.Round(time.Millisecond), lateBound)
					}
					m.worst[*h] = max(m.worst[*h], age)
				}
			}
			// Past the run's end, an orphan seen is followed until it
			// goes or passes the bound: one granted late in the run
			// would otherwise end the watch before it could.
			if time.Now().After(end) && !control && (!orphan || time.Now().After(end.Add(lateBound+500*time.Millisecond))) {
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
	if len(handOvers) > 0 {
		slices.Sort(handOvers)
		t.Logf("hand-over latency with the waiter's listener silent: %d hand-overs, p50 %v, max %v (bound %v)",
			len(handOvers), handOvers[len(handOvers)/2].Round(time.Millisecond), handOvers[len(handOvers)-1].Round(time.Millisecond), silentBound)
	}
	r.Add(lateDelivered, lateProxy.Faults().HeldRequests)
	return r
}
