package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// Campaign waits until this candidate leads the election, then returns its
// term. Candidates are served in arrival order, through the lock's wait
// queue, across processes: a resignation hands the election to the
// candidate that has waited longest, in the release's own round trip, and a
// leader that crashed is replaced once its lease runs out. value says who
// leads (an address, a host name): it is what [Election.Leader] and
// [Election.Observe] report. It must be non-empty valid UTF-8 without a
// NUL byte, of at most [MaxValueLen] bytes, on every backend; any other
// value is refused before anything is sent.
//
// The term's lease is renewed automatically until the term ends (see
// [Term.Done]); its fence, [Term.Fence], carries a token above every
// earlier term's. Present it with every write the leader makes.
//
// Campaign on an Election whose [lock.Locker] was closed returns an error
// matching [ErrClosed]: a closed Locker renews no lease. Campaign through
// a Locker whose candidate leads the election (a term won through it, in
// this process, that has not ended) returns an error matching [ErrLeading]
// at once. Campaigns started together through one Locker are queued one
// behind the other, as different candidates' are.
//
// ctx bounds the wait. When it ends, Campaign returns an error matching
// ctx.Err() and holds nothing: a lock granted meanwhile is released to the
// next candidate. An invalid argument returns an error matching
// [fence.ErrInvalid] before anything is sent; other errors come from the
// lock's backend (see [Run], which retries them).
func (e *Election) Campaign(ctx context.Context, value string) (*Term, error) {
	if err := checkCtx("Campaign", ctx); err != nil {
		return nil, err
	}
	if err := checkValue("Campaign", value); err != nil {
		return nil, err
	}
	ctx, span := e.tel.startCampaign(ctx, e.name)
	t, err := e.campaign(ctx, value)
	e.tel.endCampaign(span, t, err)
	return t, err
}

// recordOutcome is what writing the leader record found.
type recordOutcome int

const (
	recorded recordOutcome = iota // the record names the term
	notHeld                       // the lock is no longer the term's
	newer                         // the record names a newer term (see lockbackend.Recorder)
)

func (e *Election) campaign(ctx context.Context, value string) (*Term, error) {
	for {
		if lockbackend.Closed(e.locker) {
			// A closed Locker renews nothing: a term won now would be lost
			// a TTL later, and won again, for ever.
			return nil, fmt.Errorf("election: Campaign %q: %w", e.name, ErrClosed)
		}
		if v, ok := leading.Load(e.leadKey()); ok {
			// This Locker's candidate leads: Campaign would queue behind its
			// own term until ctx ended.
			return nil, fmt.Errorf("election: Campaign %q: term %d already leads: %w", e.name, v.(*Term).fence.Token, ErrLeading)
		}
		lease, err := e.locker.Acquire(ctx, e.name, e.ttl, lock.AutoRenew())
		if err != nil {
			return nil, fmt.Errorf("election: Campaign %q: %w", e.name, err)
		}
		if lease.Validity() <= e.margin {
			// The grant reached this candidate with no time left (a hand-over
			// that arrived late, a pause): it would end at once. Queue again
			// before announcing it.
			_ = lease.Release(ctx)
			continue
		}
		f := lease.Fence()
		outcome, above, err := e.record(ctx, f, value)
		switch {
		case err != nil:
			_ = lease.Release(ctx)
			return nil, fmt.Errorf("election: Campaign %q: recording the leader: %w", e.name, err)
		case outcome == newer:
			// Redis lost the lock's token state and its clock went back:
			// this term's token is below a term already recorded, so storage
			// would refuse its fence. Raise the token state and queue again.
			_ = lease.Release(ctx)
			if err := e.locker.Advance(ctx, e.name, above); err != nil {
				return nil, fmt.Errorf("election: Campaign %q: advancing tokens past term %d: %w", e.name, above, err)
			}
			continue
		case outcome == notHeld:
			// The lease was lost between its grant and the record (a pause,
			// a slow network): this candidate never led. Queue again.
			_ = lease.Release(ctx)
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("election: Campaign %q: %w", e.name, err)
			}
			continue
		}
		return e.newTerm(lease, value), nil
	}
}

// record writes the leader record beside the lock (on Redlock, on every
// node: a quorum must name the term) and reports whether it names the
// term, or the newer term's token above when it names a newer one.
func (e *Election) record(ctx context.Context, f fence.Fence, value string) (recordOutcome, fence.Token, error) {
	err := e.rec.PutRecord(ctx, f, value, e.ttl)
	var ne *lockbackend.NewerRecordError
	switch {
	case err == nil:
		return recorded, 0, nil
	case errors.As(err, &ne):
		return newer, ne.Token, nil
	case errors.Is(err, lock.ErrNotHeld):
		return notHeld, 0, nil
	}
	return notHeld, 0, err
}

// Term is one candidate's time as leader, from the [Election.Campaign] that
// won it until [Term.Done] closes. Its fence is fixed for its life. A Term
// is safe for concurrent use.
type Term struct {
	e     *Election
	lease *lock.Lease
	fence fence.Fence

	done     chan struct{}
	endOnce  sync.Once
	mu       sync.Mutex
	value    string // the term's value, changed by Proclaim
	err      error
	released chan struct{} // closed once the watcher has let the lease go
}

// leading holds the live term of each Locker and election name in this
// process, so that a second Campaign through the Locker that leads is
// refused rather than queued behind its own term.
var leading sync.Map // leadKey → *Term

type leadKey struct {
	locker *lock.Locker
	name   string
}

func (e *Election) leadKey() leadKey { return leadKey{e.locker, e.name} }

func (e *Election) newTerm(lease *lock.Lease, value string) *Term {
	t := &Term{e: e, lease: lease, value: value, fence: lease.Fence(), done: make(chan struct{}), released: make(chan struct{})}
	leading.Store(e.leadKey(), t)
	e.tel.won()
	go t.watch()
	go t.keepRecord()
	return t
}

// Fence returns what the leader presents to storage with every read and
// write it makes in this term: the election's name as the resource, the
// term's token (above every earlier term's) and its holder id. A deposed
// leader's fence is refused as stale by every fencekit store once the next
// leader has used its own there.
func (t *Term) Fence() fence.Fence { return t.fence }

// Value returns the term's value: the one it was won with, or the last one
// [Term.Proclaim] set.
func (t *Term) Value() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.value
}

// Done returns a channel that is closed when the term ends: by
// [Term.Resign], or as soon as its lease can no longer be known held (a
// renewal refused, or renewals failing until the lease's validity came
// within the step-down margin, [Election.StepDown]). It closes at least
// that margin before any other candidate can be elected, as long as the
// clock assumption of the package doc holds: stop acting as leader when it
// closes. [Term.Err] says why it closed.
func (t *Term) Done() <-chan struct{} { return t.done }

// Err returns nil while the term lasts; then an error matching
// [ErrResigned] after a resignation, or [ErrLost] (and [lock.ErrNotHeld])
// when the lease was lost.
func (t *Term) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Leading reports whether the term is still known to lead on the local
// clock at the moment of the call: it has not ended and its lease's
// validity is above the step-down margin. Unlike a look at [Term.Done], it
// does not depend on a goroutine having run since the validity ran out (a
// process resumed from a long pause). A pause after the check outlasts any
// check: keep presenting the fence.
func (t *Term) Leading() bool {
	return t.Err() == nil && t.lease.Validity() > t.e.margin
}

// Resign ends the term and hands the election to the next queued
// candidate at once, in one round trip: [Term.Done] closes first, then the
// lock is released, and the release grants it to the candidate that has
// waited longest. It returns nil when the lock was released or the term
// had already ended; an error matching ctx.Err() when ctx ended before
// the release was known to reach the server (it goes on in the background,
// bounded, and [lock.Locker.Close] waits for it); or the backend's error,
// when the lock then runs out its TTL. Resign returns by ctx's end in every
// case, a term lost to a silent server included (its release then goes on
// in the background, bounded by the TTL).
func (t *Term) Resign(ctx context.Context) error {
	if err := checkCtx("Resign", ctx); err != nil {
		return err
	}
	if !t.end(fmt.Errorf("election: term %d of %q: %w", t.fence.Token, t.e.name, ErrResigned)) {
		// The term had ended: wait for its release (a lost term's goes on
		// for up to a TTL when Redis is silent) no longer than ctx allows.
		select {
		case <-t.released:
			return nil
		default:
		}
		select {
		case <-t.released:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("election: Resign %q term %d: the ended term's release is still under way: %w", t.e.name, t.fence.Token, ctx.Err())
		}
	}
	err := t.lease.Release(ctx)
	close(t.released)
	if err != nil && errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, ctx.Err()) {
		return nil // lost before the release: nothing left to give up
	}
	if err != nil {
		return fmt.Errorf("election: Resign %q term %d: %w", t.e.name, t.fence.Token, err)
	}
	return nil
}

// end closes Done with err, once, and reports whether this call did.
func (t *Term) end(err error) bool {
	ended := false
	t.endOnce.Do(func() {
		t.mu.Lock()
		t.err = err
		t.mu.Unlock()
		leading.CompareAndDelete(t.e.leadKey(), t)
		// Counted before Done closes, so that whoever sees Done closed
		// also sees the term counted as ended.
		t.e.tel.ended(errors.Is(err, ErrResigned))
		close(t.done)
		ended = true
	})
	return ended
}

// lost ends the term as lost, with cause, and lets the lease go so that the
// next candidate need not wait for it to run out, if Redis still has it.
func (t *Term) lost(cause error) {
	err := fmt.Errorf("election: term %d of %q: %w: %w", t.fence.Token, t.e.name, ErrLost, cause)
	if !t.end(err) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.e.ttl)
	defer cancel()
	_ = t.lease.Release(ctx)
	close(t.released)
}

// watch ends the term as soon as its lease can no longer be known held:
// when the lease ends, or when its validity comes within the drift
// allowance (see the package doc). Validity moves on with each renewal, so
// the deadline is read again each time it comes.
func (t *Term) watch() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		v := t.lease.Validity()
		if v <= t.e.margin {
			t.lost(fmt.Errorf("lease validity within the step-down margin (%v): %w", t.e.margin, lock.ErrNotHeld))
			return
		}
		timer.Reset(v - t.e.margin)
		select {
		case <-t.lease.Done():
			t.lost(t.lease.Err())
			return
		case <-t.done:
			return
		case <-timer.C:
		}
	}
}

// keepRecord keeps the leader record as long as the lock, renewing its
// expiry a third of the TTL at a time; a term whose record refresh finds
// the lock gone ends.
func (t *Term) keepRecord() {
	every := max(t.e.ttl/3, time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := t.e.rec.KeepRecord(ctx, t.fence, t.e.ttl)
		cancel()
		if errors.Is(err, lock.ErrNotHeld) {
			// The lock or the record is no longer the term's (on Redlock, a
			// quorum's): the lease was lost, whatever its local validity says.
			t.lost(fmt.Errorf("the lock or leader record was gone: %w", lock.ErrNotHeld))
			return
		}
	}
}
