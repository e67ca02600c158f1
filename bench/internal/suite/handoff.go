package suite

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Hand-off workload: waiters on one resource, each holding the lock for Hold
// and then working for Work outside it, spread over one or more Lockers (each
// with its own client, standing in for processes).
const (
	Hold = time.Millisecond
	Work = 5 * time.Millisecond
)

// Handoff is one run of the hand-off workload.
type Handoff struct {
	Contender string
	Waiters   int
	Lockers   int
	Grants    int
	Window    time.Duration
	GrantsPS  float64       // grants per second
	P50, P99  time.Duration // from a Release call to the next grant of a waiter already waiting
	Cmds      float64       // commands per grant: sent by the clients, plus (un)subscribes counted by the server
	MeanHold  time.Duration // the hold as measured (HoldFor keeps it close to Hold)
	RTT       time.Duration // median PING round trip before the run
	Errors    int           // acquisitions that failed for a reason other than the end of the run
	// Allocs is heap allocations per grant in the whole process over the
	// window: the contender's clients and waiters, and the workload's own.
	Allocs float64
}

// HoldFor holds for d as exactly as the machine allows. A sleep cannot:
// on a 2-core VM any sleep under 1ms can last about 1.09ms (the timer's
// resolution there), and a 1ms one 1.1-1.3ms, which every contender would
// pay and the capacity target would count against the lock. So it sleeps
// only for what exceeds holdSleepFloor and yields for the rest, as a
// holder doing 1ms of work would; one holder at a time does so, since
// only one holds the lock.
func HoldFor(d time.Duration) {
	end := time.Now().Add(d)
	if d > holdSleepFloor {
		time.Sleep(d - holdSleepFloor)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}

// holdSleepFloor is the part of a hold HoldFor spends yielding rather than
// asleep.
const holdSleepFloor = 1500 * time.Microsecond

// Capacity is 1/(Hold + RTT): grants per second of a lock whose hand-off
// costs exactly one round trip.
func (h Handoff) Capacity() float64 { return 1 / (Hold + h.RTT).Seconds() }

// HeldCapacity is Capacity with the hold as measured.
func (h Handoff) HeldCapacity() float64 { return 1 / (h.MeanHold + h.RTT).Seconds() }

// RunHandoff runs the workload for contender on srv: warm first, then a
// measured window.
func RunHandoff(ctx context.Context, srv *Server, contender string, waiters, lockers int, warm, window time.Duration, prefix string) (Handoff, error) {
	h := Handoff{Contender: contender, Waiters: waiters, Lockers: lockers}
	var err error
	if h.RTT, err = srv.RTT(ctx, 100); err != nil {
		return h, err
	}
	ls := make([]Locker, lockers)
	for i := range ls {
		if ls[i], err = NewLocker(contender, srv.Addr, prefix); err != nil {
			return h, err
		}
	}
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	resource := "handoff"
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		measuring    atomic.Bool
		releaseStart atomic.Int64 // unix ns of the latest Release call
		grants       atomic.Int64
		held         atomic.Int64
		errs         atomic.Int64
		mu           sync.Mutex
		handoffs     []time.Duration
		wg           sync.WaitGroup
	)
	for w := range waiters {
		l := ls[w%lockers]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				asked := time.Now().UnixNano()
				lease, err := l.Acquire(runCtx, resource)
				if err != nil {
					if runCtx.Err() == nil && !errors.Is(err, context.Canceled) {
						errs.Add(1)
						time.Sleep(Work)
					}
					continue
				}
				got := time.Now().UnixNano()
				if measuring.Load() {
					grants.Add(1)
					if rs := releaseStart.Load(); rs > asked {
						mu.Lock()
						handoffs = append(handoffs, time.Duration(got-rs))
						mu.Unlock()
					}
				}
				HoldFor(Hold)
				rs := time.Now().UnixNano()
				if measuring.Load() {
					held.Add(rs - got)
				}
				releaseStart.Store(rs)
				if err := lease.Release(context.WithoutCancel(runCtx)); err != nil {
					errs.Add(1)
				}
				time.Sleep(Work)
			}
		}()
	}
	count := func() (int64, error) {
		var n int64
		for _, l := range ls {
			n += l.Commands()
		}
		st, err := srv.Stats(ctx)
		for _, name := range []string{"subscribe", "unsubscribe", "ssubscribe", "sunsubscribe"} {
			n += st[name].Calls
		}
		return n, err
	}
	time.Sleep(warm)
	cmds0, err0 := count()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	measuring.Store(true)
	time.Sleep(window)
	measuring.Store(false)
	h.Window = time.Since(t0)
	runtime.ReadMemStats(&m1)
	cmds1, err1 := count()
	cancel()
	wg.Wait()
	if err := errors.Join(err0, err1); err != nil {
		return h, err
	}
	h.Grants = int(grants.Load())
	h.Errors = int(errs.Load())
	if h.Grants == 0 {
		return h, fmt.Errorf("%s: no grant in %v", contender, window)
	}
	h.GrantsPS = float64(h.Grants) / h.Window.Seconds()
	h.P50 = percentile(handoffs, 0.50)
	h.P99 = percentile(handoffs, 0.99)
	h.Cmds = float64(cmds1-cmds0) / float64(h.Grants)
	h.Allocs = float64(m1.Mallocs-m0.Mallocs) / float64(h.Grants)
	h.MeanHold = time.Duration(held.Load() / int64(h.Grants))
	return h, nil
}
