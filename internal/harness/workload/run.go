package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// Config is one run of the workload.
type Config struct {
	Locker *lock.Locker
	// LockerFor, when set, returns the Locker of worker w (1-based), so
	// that some holders can reach Redis through a faulty network while
	// others do not. default: Locker for every worker.
	LockerFor func(w int) *lock.Locker
	// AcquireOpts apply to every acquisition (for example lock.AutoRenew).
	AcquireOpts []lock.AcquireOption
	Counter     Counter
	Mode        Mode
	Resources   []string
	// Workers per resource. default: 3
	Workers int
	// TTL is the lease of every grant. default: 20ms
	TTL time.Duration
	// Duration of the run; workers start no new operation after it.
	// default: 1s
	Duration time.Duration
	// Pause returns how long a worker pauses between its read and its
	// write. default: up to TTL/2, and past the lease (2·TTL) one time in
	// four.
	Pause func(r *rand.Rand) time.Duration
	// DelayWrite, when set, returns how long a write is held in flight after
	// the worker has decided on it (a slow network), before it reaches
	// storage.
	DelayWrite func(r *rand.Rand) time.Duration
	// Fault, when set, runs once beside the workers (for example, killing
	// Redis midway); the run waits for it.
	Fault func(ctx context.Context)
	// ProgressWithin, when set with Fault, keeps the run going past
	// Duration until a write that started after Fault returned has been
	// acknowledged, for at most ProgressWithin after Fault returned. A
	// check of progress after the fault (Result.AckedAfterFault) then asks
	// that writes resume within that bound, rather than within whatever a
	// loaded machine leaves of Duration once the fault is over.
	// default: the run ends at Duration.
	ProgressWithin time.Duration
	// Events, when set, receives every step of every operation, for a
	// timeline. It is called from many goroutines.
	Events func(Event)
}

// Event is one step of one operation.
type Event struct {
	At       time.Duration // since the run started
	Op       int64         // operation id, unique in the run
	Worker   int
	Resource string
	Token    fence.Token
	Kind     EventKind
	State    State         // the state read or written
	Pause    time.Duration // for Paused
	Err      error         // for Refused and Failed
}

// EventKind names a step.
type EventKind int

// The steps of an operation.
const (
	Acquired EventKind = iota
	ReadDone
	Paused
	Written
	Refused // refused as stale
	Failed  // any other error
)

// Result is what a run did and what the checker found.
type Result struct {
	Mode     Mode
	Storage  string
	Attempts int64 // operations that got a lease
	Acked    int64 // writes acknowledged
	Stale    int64 // reads or writes refused as stale
	// Retryable counts reads or writes the store refused without a stale
	// fence, changing nothing (a Refuser's: serialization failures).
	Retryable int64
	// Levels counts, per isolation level, how the fenced transactions
	// ended (a LevelReporter's; nil otherwise).
	Levels    map[string]LevelCount
	Uncertain int64 // writes that failed otherwise: they may or may not have landed
	LockErr   int64 // failed acquisitions (Redis down, for example)
	Final     int64 // sum of the final counters
	// Lost is the number of acknowledged increments missing from the final
	// counters. Every acknowledged write stored N = (the N it read) + 1; an
	// increment is in the final counter only if no other acknowledged write
	// stored the same N (both read the same state: one overwrote the other)
	// and N is not above the final N (a later write went back below it).
	// Writes that failed without an answer do not count either way.
	Lost int64
	// Phantom is the number of final increments that no write accounts for,
	// beyond the uncertain ones: it must be zero in every mode.
	Phantom int64
	// Regressions counts admitted writes whose token was below the token of
	// the write they read: admitted tokens going down.
	Regressions int64
	// AckedAfterFault counts acknowledged writes that started after Fault
	// returned: progress after the fault.
	AckedAfterFault int64
	// FirstAckAfterFault is the time from Fault's return to the first
	// acknowledged write that started after it; zero when there was none.
	FirstAckAfterFault time.Duration
	Elapsed            time.Duration
}

// Safe reports whether the checker found nothing wrong.
func (r Result) Safe() bool { return r.Lost == 0 && r.Regressions == 0 && r.Phantom == 0 }

func (r Result) String() string {
	s := fmt.Sprintf("%s/%s: attempts=%d acked=%d stale=%d retryable=%d uncertain=%d lockErr=%d final=%d lost=%d regressions=%d phantom=%d ackedAfterFault=%d firstAckAfterFault=%v in %v",
		r.Storage, r.Mode, r.Attempts, r.Acked, r.Stale, r.Retryable, r.Uncertain, r.LockErr, r.Final, r.Lost, r.Regressions, r.Phantom, r.AckedAfterFault, r.FirstAckAfterFault, r.Elapsed.Round(time.Millisecond))
	if len(r.Levels) > 0 {
		s += " (by isolation level: " + levelsString(r.Levels) + ")"
	}
	return s
}

type perResource struct {
	acked, uncertain atomic.Int64
	mu               sync.Mutex
	written          []int64 // N of each acknowledged write
}

// Run runs the workload and checks it. It returns an error only when the run
// could not take place (setup failed, reading the final state failed).
func Run(ctx context.Context, c Config) (Result, error) {
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.TTL <= 0 {
		c.TTL = 20 * time.Millisecond
	}
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.Pause == nil {
		ttl := c.TTL
		c.Pause = func(r *rand.Rand) time.Duration {
			if r.IntN(4) == 0 {
				return 2 * ttl
			}
			return rand.N(ttl / 2)
		}
	}
	if err := c.Counter.Setup(ctx, c.Mode, c.Resources); err != nil {
		return Result{}, fmt.Errorf("workload: setup: %w", err)
	}
	res := Result{Mode: c.Mode, Storage: c.Counter.Name()}
	stats := make(map[string]*perResource, len(c.Resources))
	for _, r := range c.Resources {
		stats[r] = &perResource{}
	}
	var (
		attempts, acked, stale, lockErr, regressions, afterFault atomic.Int64
		retryable                                                atomic.Int64
		opID                                                     atomic.Int64
		faultDone                                                atomic.Int64 // ns since start; 0 while running
		firstAfterFault                                          atomic.Int64 // ns since start of the first ack after it
	)
	refuser, _ := c.Counter.(Refuser)
	refusedOtherwise := func(err error) bool { return refuser != nil && refuser.Refused(err) }
	start := time.Now()
	emit := func(e Event) {
		if c.Events != nil {
			e.At = time.Since(start)
			c.Events(e)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTimer(c.Duration)
		defer t.Stop()
		select {
		case <-runCtx.Done():
			return
		case <-t.C:
		}
		if c.Fault == nil || c.ProgressWithin <= 0 {
			cancel()
			return
		}
		// Past Duration: on until a write made after the fault is
		// acknowledged, or ProgressWithin has passed since the fault.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			fd := faultDone.Load()
			if afterFault.Load() > 0 || fd > 0 && time.Since(start) > time.Duration(fd)+c.ProgressWithin {
				cancel()
				return
			}
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	var wg sync.WaitGroup
	if c.Fault != nil {
		wg.Go(func() {
			c.Fault(runCtx)
			faultDone.Store(int64(time.Since(start)))
		})
	}
	worker := 0
	for _, resource := range c.Resources {
		for range c.Workers {
			worker++
			w := worker
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			st := stats[resource]
			locker := c.Locker
			if c.LockerFor != nil {
				locker = c.LockerFor(w)
			}
			wg.Go(func() {
				for runCtx.Err() == nil {
					opStart := time.Since(start)
					lease, err := locker.Acquire(runCtx, resource, c.TTL, c.AcquireOpts...)
					if err != nil {
						if runCtx.Err() == nil {
							lockErr.Add(1)
							time.Sleep(2 * time.Millisecond) // Redis is down: do not spin
						}
						continue
					}
					attempts.Add(1)
					f := lease.Fence()
					op := opID.Add(1)
					emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Acquired})
					// The operation finishes even if the run ends: an
					// acknowledged write must be counted.
					opCtx := context.WithoutCancel(ctx)
					refused := func(err error) {
						stale.Add(1)
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Refused, Err: err})
					}
					s, err := c.Counter.Read(opCtx, c.Mode, f, resource)
					switch {
					case errors.Is(err, fence.ErrStale):
						refused(err)
						_ = lease.Release(opCtx)
						continue
					case refusedOtherwise(err):
						retryable.Add(1)
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Failed, Err: err})
						_ = lease.Release(opCtx)
						continue
					case err != nil:
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Failed, Err: err})
						_ = lease.Release(opCtx)
						continue
					}
					emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: ReadDone, State: s})
					if d := c.Pause(rng); d > 0 {
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Paused, Pause: d})
						time.Sleep(d)
					}
					next := State{N: s.N + 1, Last: f.Token}
					if c.DelayWrite != nil {
						if d := c.DelayWrite(rng); d > 0 {
							time.Sleep(d)
						}
					}
					err = c.Counter.Write(opCtx, c.Mode, f, resource, next)
					switch {
					case err == nil:
						acked.Add(1)
						st.acked.Add(1)
						st.mu.Lock()
						st.written = append(st.written, next.N)
						st.mu.Unlock()
						if f.Token < s.Last {
							regressions.Add(1)
						}
						if fd := faultDone.Load(); fd > 0 && int64(opStart) > fd {
							afterFault.Add(1)
							firstAfterFault.CompareAndSwap(0, int64(time.Since(start)))
						}
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Written, State: next})
					case errors.Is(err, fence.ErrStale):
						refused(err)
					case refusedOtherwise(err):
						// Nothing changed: not uncertain, so a write
						// refused this way that landed is a phantom.
						retryable.Add(1)
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Failed, Err: err})
					default:
						st.uncertain.Add(1)
						emit(Event{Op: op, Worker: w, Resource: resource, Token: f.Token, Kind: Failed, Err: err})
					}
					_ = lease.Release(opCtx)
				}
			})
		}
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Attempts, res.Acked, res.Stale = attempts.Load(), acked.Load(), stale.Load()
	res.Retryable = retryable.Load()
	if lr, ok := c.Counter.(LevelReporter); ok {
		res.Levels = lr.LevelCounts()
	}
	res.LockErr, res.Regressions = lockErr.Load(), regressions.Load()
	res.AckedAfterFault = afterFault.Load()
	if first := firstAfterFault.Load(); first > 0 {
		res.FirstAckAfterFault = time.Duration(first - faultDone.Load())
	}
	for _, r := range c.Resources {
		fin, err := c.Counter.Final(ctx, c.Mode, r)
		if err != nil {
			return res, fmt.Errorf("workload: final state of %q: %w", r, err)
		}
		st := stats[r]
		res.Final += fin.N
		res.Uncertain += st.uncertain.Load()
		res.Lost += lostIncrements(st.written, fin.N)
		if extra := fin.N - st.acked.Load() - st.uncertain.Load(); extra > 0 {
			res.Phantom += extra
		}
	}
	return res, nil
}

// lostIncrements counts the acknowledged writes (each storing the N in
// written) whose increment is not in a final counter of final.
func lostIncrements(written []int64, final int64) int64 {
	seen := make(map[int64]int, len(written))
	for _, n := range written {
		seen[n]++
	}
	var kept int64
	for n := range seen {
		if n >= 1 && n <= final {
			kept++
		}
	}
	return int64(len(written)) - kept
}
