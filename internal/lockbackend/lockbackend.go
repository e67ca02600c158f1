package lockbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/fencekit/fencekit/fence"
)

// Backend holds the locks of one deployment (a Redis server or Cluster,
// Redlock's nodes, a PostgreSQL database). Its methods are safe for
// concurrent use. Package lock calls them with checked arguments (see the
// package doc) and turns their answers into Leases, errors and telemetry.
type Backend interface {
	// Info says what the backend offers; package lock asks once, when the
	// Locker is made.
	Info() Info

	// Try makes one attempt to grant req.Resource to req.Holder for
	// req.TTL, in one round trip, and answers with the grant and its token
	// (promise 1) or with a refusal that says how long the current lease
	// has left. The server decides the lease's end (promise 2).
	//
	// With req.Ordered, a free lock with live waiters queued goes to the
	// first of them (the try is refused, and the grant is announced to that
	// waiter); with req.Queue as well, a refused try queues req.Holder at
	// the end of the queue, or refreshes its entry where it stands, and
	// Outcome.Ref names the entry. A try of a holder to which a release
	// handed the lock while it was queued returns that grant
	// ([Outcome.HandedOver]). With req.Owner, a lock held by the same owner
	// is entered again (a hold is added; [Outcome.Holder] is the holder of
	// the lock), and the lock's release waits for the owner's last hold.
	//
	// A client retry of a Try that ran returns the grant that run made,
	// not a refusal. If ctx ends or the reply is lost, Try releases what
	// the attempt may have taken (see the package doc) and returns an
	// error; it never returns a grant with an error.
	Try(ctx context.Context, req *Request) (Outcome, error)

	// Extend lengthens h's lease to at least ttl from now, if h's grant
	// still holds the lock; an extension never shortens a lock. It returns
	// how long the lease is known held, counted from before the call was
	// sent (promise 2: no more than the server holds, less the drift
	// allowance where one applies). It returns an error matching
	// [ErrNotHeld], and changes nothing, when the grant no longer holds
	// the lock. The caller runs one Extend per Hold at a time.
	Extend(ctx context.Context, h Hold, ttl time.Duration) (time.Duration, error)

	// Release gives up h's grant (or, for an owner's hold, that hold), in
	// one round trip. The release that frees the lock hands it to the first
	// live waiter in the queue and wakes it, in the same step. It returns
	// nil when it released, an error matching [ErrNotHeld] when the grant
	// no longer held the lock (nothing changed), and one matching
	// [ErrReplyLost] when the release may or may not have happened. A
	// client retry of a release that ran may answer ErrNotHeld.
	Release(ctx context.Context, h Hold) error

	// TTL returns the time for which the server still holds h's grant, or
	// an error matching [ErrNotHeld] when it no longer does. Reads only.
	TTL(ctx context.Context, h Hold) (time.Duration, error)

	// Abandon undoes what an attempt of holder may have left behind after
	// a lost reply or a waiter that gave up: a grant to holder (or, with
	// acq not empty, the owner's hold named acq), including one a release
	// handed to holder while it was queued (which is handed on), and
	// holder's entry in the queue. Doing it twice, or for an attempt that
	// took nothing, changes nothing more.
	Abandon(ctx context.Context, resource, holder, acq string) error

	// Close ends the backend's own goroutines and connections (never the
	// clients it was given) and waits until deadline at most for the calls
	// it left in flight. It releases no lease. Package lock calls it once,
	// after the Locker's renewals and cleanups have stopped.
	Close(deadline time.Time)
}

// Hold is a backend's record of one grant, made by [Backend.Try] or
// [Queue.Adopt] and handed back to Extend, Release and TTL: what those
// need (keys, the holder id, an owner's hold id), kept in whatever form
// makes them cheapest. Package lock never looks inside, but asks whether it
// is a [LossSignal].
type Hold any

// LossSignal is implemented by a Hold whose backend learns, by itself, that
// the server no longer holds the grant (etcd: the session's lease revoked,
// the key deleted from outside, the cluster restored to an older revision).
// Lost returns a channel that closes once no belief in the grant may last,
// never on the grant's own release; package lock then ends the Lease at
// once (promise 6: a belief ends the moment the backend learns the lease is
// gone, not only when the clock says so).
type LossSignal interface {
	Lost() <-chan struct{}
}

// Info is what a backend offers.
type Info struct {
	// Name names the backend in errors and telemetry: "redis", "redlock",
	// "postgres", "etcd".
	Name string
	// Quorum is how many nodes must agree for a lease to be held: 1 but
	// for Redlock.
	Quorum int
	// Queue says the backend implements [Queue]: waiting in arrival order,
	// woken by the release. Without it, Acquire polls on the Locker's
	// WaitStrategy.
	Queue bool
	// Owner says the backend supports owners' re-entrant holds
	// ([Request.Owner]); without it, package lock refuses lock.Owner with
	// [ErrUnsupported].
	Owner bool
}

// Request is one try of an acquisition.
type Request struct {
	Resource string
	// TTL is the lease asked for, in whole milliseconds.
	TTL time.Duration
	// Holder is the acquisition's fresh holder id: the grant's holder
	// unless it enters an owner's lock again, or the backend grants under
	// an id of its own for each try ([Outcome.Holder] says which; Redlock
	// does, since a node answers a try under an id it granted before as a
	// client's retry).
	Holder string
	// Owner names the owner of a re-entrant acquisition; "" for none.
	Owner string
	// Ordered says the try respects the queue (every try of lock's
	// TryAcquire and Acquire does).
	Ordered bool
	// Queue says a refused try joins the queue, or refreshes the entry of
	// Holder already there; set only for a waiter whose [Waiter] is
	// confirmed, or that is queued already.
	Queue bool
	// Once says the try is TryAcquire's, not one of Acquire's: for a
	// backend's error messages, which name the call.
	Once bool
}

// Outcome is the answer to one try.
type Outcome struct {
	// Granted says the try holds the lock; the fields below Remaining are
	// then unused.
	Granted bool
	// Hold is the grant's record, for Extend, Release and TTL.
	Hold Hold
	// Token is the grant's fencing token, at least 1.
	Token fence.Token
	// Holder is the grant's holder id: the request's, or for an owner's
	// re-entry the holder of the lock it entered.
	Holder string
	// Known is how long the lease is known held, counted from before the
	// try was sent: the TTL asked for (less a drift allowance where one
	// applies), or for a grant a release handed over while the holder was
	// queued, what the server says is left of it. Never more than the
	// server holds.
	Known time.Duration
	// HandedOver says a release granted the lock to this holder while it
	// was queued, and this try found the grant.
	HandedOver bool
	// StateMissed says the grant found no token state for the resource and
	// issued a token anchored to the server's clock (counted in
	// telemetry).
	StateMissed bool

	// Remaining is, for a refusal, how long the current lease has left;
	// negative when it has no expiry or is unknown.
	Remaining time.Duration
	// Place is, for a refused try of a queued holder, its place in the
	// queue (0: the head), or -1 when unknown.
	Place int64
	// Ref is, for a refused try that queued or refreshed the holder, the
	// backend's name for the entry as refreshed (any non-zero number); 0
	// when the holder is not queued. A [HandOver] names the entry it was
	// granted on with it.
	Ref int64
}

// QueueRefresh is how often a queued waiter refreshes its entry (by
// trying again with [Request.Queue]); an entry not refreshed for
// QueueLife is passed over, which bounds how long a waiter that vanished
// can be handed the lock.
const (
	QueueRefresh = time.Second
	QueueLife    = 3 * QueueRefresh
)

// Queue is implemented by backends that wait in arrival order ([Info.Queue]).
type Queue interface {
	// Join registers a waiter of holder for resource's hand-overs. With
	// create false it only joins a resource that already has waiters in
	// this process, at no cost in I/O, and returns nil otherwise; it
	// returns nil once the backend is closed.
	Join(resource, holder string, create bool) Waiter

	// Adopt makes the Hold of the grant g that a release handed to the
	// waiter req.Holder, announced to its Waiter, so that the waiter has
	// the lock without a round trip.
	Adopt(req *Request, g HandOver) Hold
}

// Waiter is one waiting acquisition's view of its resource's hand-overs.
// Only a try made while it is confirmed may queue (see [Request.Queue]),
// so that no hand-over can slip between a refused try and the wait.
type Waiter interface {
	// State returns whether hand-overs are covered now (confirmed), the
	// channel that closes once they are, and the one that closes if that
	// coverage is lost after that.
	State() (ready, lost <-chan struct{}, confirmed bool)
	// Wake receives when a release freed the lock with no live waiter
	// queued: one waiter of the process tries.
	Wake() <-chan struct{}
	// Granted receives the grant a release handed to this waiter's holder.
	Granted() <-chan HandOver
	// Placed receives the latest news of this waiter's place among the
	// first of the queue.
	Placed() <-chan Place
	// Owe records that the waiter took a wake-up and has not tried on it
	// yet (true) or has tried since (false).
	Owe(bool)
	// Leave removes the waiter. One that leaves without the lock hands a
	// wake-up it owes on to another waiter of the resource.
	Leave(acquired bool)
}

// HandOver is a grant a release made to a queued waiter.
type HandOver struct {
	Token fence.Token
	// Ref is the waiter's entry as the release found it ([Outcome.Ref]); a
	// hand-over whose Ref is not the waiter's latest is stale (the try that
	// refreshed the entry since found the lock in other hands), and the
	// waiter tries instead.
	Ref int64
	// Age is how long after the refresh named by Ref the grant was made,
	// on the server's clock: the lease is counted from the refreshing try's
	// send plus Age, no later than the grant.
	Age time.Duration
}

// Place is a waiter's place among the first of the queue, told when a
// release, a grant or a waiter that left changed who is first.
type Place struct {
	Place int // 0: the head
	// Remaining is the current lease's remaining time as of At, or
	// [NoExpiry], or [Free].
	Remaining time.Duration
	At        time.Time
}

// Place.Remaining's values that are not a time.
const (
	NoExpiry = -time.Millisecond     // the lease does not expire
	Free     = -2 * time.Millisecond // the lock is free
)

// Advancer is implemented by backends whose token counter can be raised,
// for lock.Locker.Advance: Advance raises resource's counter to at least
// atLeast and never lowers it, so the next grant's token is above it.
type Advancer interface {
	Advance(ctx context.Context, resource string, atLeast fence.Token) error
}

// Record is the value kept beside a resource's lock by the grant that
// wrote it, with that grant's token.
type Record struct {
	Value string
	Token fence.Token
	// Seq counts the values the grant proclaimed since it wrote the
	// record ([Proclaimer]; 0 for the value it was written with): a
	// watcher orders one grant's values by it.
	Seq uint64
}

// Proclaimer is implemented by a [Recorder] whose record's value can
// change within a grant (the election's Term.Proclaim).
type Proclaimer interface {
	// ProclaimRecord makes value the value of f's record, while f's grant
	// holds the lock and the record is f's, counts up the record's Seq and
	// announces the change. It returns nil once the record holds value (a
	// client retry of a change already made changes and announces nothing
	// more), and an error matching [ErrNotHeld] when the lock or the record
	// is no longer f's (nothing changed).
	ProclaimRecord(ctx context.Context, f fence.Fence, value string) error
}

// Recorder keeps one record beside each resource's lock (promise 4): the
// election's leader. Every method that writes takes the grant's fence and
// writes only while that grant holds the lock.
type Recorder interface {
	// PutRecord writes value as f's record while f's grant holds the
	// lock, and announces it to the watchers. It keeps the record linger
	// longer than the lock. It returns nil when the record is f's (written
	// now or by a run a client retry repeats), an error matching
	// [ErrNotHeld] when f's grant no longer holds the lock (nothing
	// written), and a [*NewerRecordError] when the record names a newer
	// grant than f's (nothing written: the token state went back).
	PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error

	// KeepRecord keeps f's record for as long as its lock and linger
	// more; call it after each extension. It returns an error matching
	// [ErrNotHeld] when the lock or the record is no longer f's.
	KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error

	// ReadRecord returns the record of the grant that holds resource's
	// lock at the moment of the read, and [ErrNoRecord] when the lock is
	// free, or is held by a grant that has written no record yet. Reads
	// only.
	ReadRecord(ctx context.Context, resource string) (Record, error)

	// WatchRecord sends what it hears of records written for resource
	// until ctx ends, then closes the channel. A Record with a token is
	// one just written; a zero Record says a write happened that must be
	// read with ReadRecord (a backend whose single message cannot vouch for
	// a quorum). A watch is not a log: writes made while it was cut off are
	// missed, so watchers also read now and then.
	WatchRecord(ctx context.Context, resource string) <-chan Record
}

// NewerRecordError is [Recorder.PutRecord]'s refusal when the record
// already names a newer grant, whose token it gives.
type NewerRecordError struct {
	Resource string
	Token    fence.Token
}

func (e *NewerRecordError) Error() string {
	return fmt.Sprintf("lock: record of %q already names token %d, a newer grant", e.Resource, e.Token)
}

// Errors a backend returns. Package lock exports the first two under its
// own names (lock.ErrNotHeld, lock.ErrTokensExhausted), so they are the
// same values.
var (
	ErrNotHeld         = errors.New("lock: lease not held")
	ErrTokensExhausted = errors.New("lock: token space exhausted, the next token would pass fence.MaxToken")

	// ErrReplyLost means a call's reply was lost (the connection failed,
	// or ctx ended first): what it asked may or may not have happened.
	ErrReplyLost = errors.New("lock: the reply was lost")

	// ErrUnsupported means the backend does not offer what was asked (an
	// owner's hold on Redlock, Advance or FenceLock on a backend without a
	// token counter of that kind). It matches errors.ErrUnsupported, and
	// fence.ErrInvalid: nothing was sent. Package lock exports it as
	// lock.ErrUnsupported.
	ErrUnsupported error = unsupported{}

	// ErrNoRecord means nobody's record stands beside the lock now.
	ErrNoRecord = errors.New("lock: no record")
)

type unsupported struct{}

func (unsupported) Error() string { return "lock: not supported by this lock backend" }

func (unsupported) Unwrap() error { return fence.ErrInvalid }

// Is makes it match the standard library's errors.ErrUnsupported too.
func (unsupported) Is(target error) bool { return target == errors.ErrUnsupported }

// Settings are a Locker's options, as package lock read them, for a
// backend's constructor ([Open]); Given says which the caller set, so a
// backend refuses with [fence.ErrInvalid] those that mean nothing to it.
type Settings struct {
	// Prefix starts the names the backend gives a resource's state
	// (Redis keys and channels; a backend with a table may ignore it).
	Prefix string
	// Retention is how long token state is kept after the last lease of a
	// resource ends.
	Retention time.Duration
	// Poll says Acquire polls on the Locker's WaitStrategy rather than
	// queueing (lock.WithWait was given).
	Poll bool
	// NodeTimeout is how long to wait for each node of a backend with
	// several; 0 when not given.
	NodeTimeout time.Duration
	// Given says which options the caller set.
	Given Given
	// Background runs f, with a context that keeps ctx's values, not its
	// cancellation, and ends after a short bound of its own (2 s): cleanup
	// that must outlive the call that needed it. The Locker's Close waits
	// for every such f started before it.
	Background func(ctx context.Context, f func(ctx context.Context))
	// Meters is where the Locker's metrics go (lock.WithMeterProvider, or
	// the global provider): a backend's own metrics go there too.
	Meters metric.MeterProvider
}

// Given is a set of options a caller set.
type Given uint

// Options of package lock, as Given reports them.
const (
	GivenPrefix Given = 1 << iota
	GivenRetention
	GivenWait
	GivenNodeTimeout
)

// Opener makes a backend from a Locker's settings, or refuses them.
type Opener func(Settings) (Backend, error)

// Open is package lock's constructor of a Locker on the backend open
// makes: it reads opts (lock.Option values) as lock.New does, passes the
// settings to open, and returns the *lock.Locker (as any, since package
// lock imports this one). Package lock sets it when it is initialised, so
// a backend package (lock/pglock) calls it after importing lock. It is the
// one hook between package lock and its backends: it carries the contract
// and nothing of any backend.
var Open func(open Opener, opts []any) (any, error)

// Of returns the backend of a *lock.Locker (given as any), for packages
// that build on a Locker (election uses its [Recorder]); nil for anything
// else. Closed reports whether the Locker's Close was called (a closed
// Locker renews no lease). Package lock sets both when it is initialised.
var (
	Of     func(locker any) Backend
	Closed func(locker any) bool
)

// ReplyLost marks err, a call's failure whose reply never came, as
// matching [ErrReplyLost]; its message is err's.
func ReplyLost(err error) error { return replyLost{err} }

type replyLost struct{ err error }

func (e replyLost) Error() string { return e.err.Error() }

func (e replyLost) Unwrap() error { return e.err }

func (e replyLost) Is(target error) bool { return target == ErrReplyLost }

// WaitUntil waits for wg, or until deadline; it reports whether wg is done.
// Close uses it to wait a bounded time for calls a backend or the Locker
// left in flight.
func WaitUntil(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// ReclaimEvery runs reclaim every period until stop closes, each time in
// batches of batch rows until one reclaims fewer (or fails), all within
// one period: how the SQL lock tables drop the rows of idle resources
// without one long statement.
func ReclaimEvery(stop <-chan struct{}, period time.Duration, batch int, reclaim func(ctx context.Context, max int) (int, error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), period)
		for {
			n, err := reclaim(ctx, batch)
			if err != nil || n < batch {
				break
			}
		}
		cancel()
	}
}
