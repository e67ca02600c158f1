package election

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// DefaultTTL is a term's lease when no [WithTTL] option is given: how long a
// leader that crashed or was cut off keeps the election before another
// candidate can win it.
const DefaultTTL = 10 * time.Second

// MaxValueLen is the longest value, in bytes, a candidate may campaign with.
const MaxValueLen = 4096

// MinTTL is the shortest term lease [WithTTL] accepts. Renewal must reach
// the lock's server between the renewal's time (a third of the TTL after the last one)
// and the step-down (a quarter of the TTL before the lease runs out, by
// default), a window of 5/12 of the TTL: under 100ms it is shorter than
// the scheduling and network delays of a loaded machine, and terms end as
// soon as they begin (10ms terms lasted 0.2-153ms on a busy 2-core
// machine). The floor is not a promise: on a 2-core machine at a load
// average of 20 to 29, under the race detector, 100ms terms lasted 0.05 to
// 5.5s and 200ms terms 0.2 to 3.7s, while 400ms and 1s terms were all kept
// for the 8s measured. Choose a TTL well above the worst delay of the
// leader's process and network: its 5/12 must cover it.
const MinTTL = 100 * time.Millisecond

// Election is one named election among candidates that share a lock
// backend (one Redis deployment, one set of Redlock masters, one PostgreSQL
// database, one etcd cluster) through their [lock.Locker]s. It is safe for
// concurrent use:
// a process may campaign, read the leader and observe at once.
type Election struct {
	locker *lock.Locker
	name   string
	ttl    time.Duration
	margin time.Duration // the step-down margin: a term ends this long before its lease's validity runs out

	rec lockbackend.Recorder // the record beside the lock, on the Locker's backend

	recordKey, channel string // on Redis; "" on another backend

	// readEvery, when set (tests only), replaces how often an observer
	// reads the leader (a third of the TTL, at most a second).
	readEvery time.Duration

	tel *instruments
}

// Option configures an [Election]. Options validate themselves: [New]
// returns their error instead of an Election.
type Option func(*config) error

type config struct {
	ttl    time.Duration
	margin time.Duration // 0: the TTL over StepDownDivisor
	mp     metric.MeterProvider
	tp     trace.TracerProvider
}

// WithTTL sets the term's lease: the lock is renewed automatically while
// the leader lives and is connected, so d is how long a crashed or cut-off
// leader keeps the election, not how long a term lasts. default:
// [DefaultTTL]. d must be at least [MinTTL] and at most [lock.MaxTTL];
// Redis keeps whole milliseconds, so a fraction of one is dropped.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("WithTTL", "non-positive TTL %v", d)
		}
		if d < MinTTL {
			return invalid("WithTTL", "TTL %v is shorter than %v, too short to renew a lease in on a loaded machine", d, MinTTL)
		}
		if d > lock.MaxTTL {
			return invalid("WithTTL", "TTL %v is longer than %v", d, lock.MaxTTL)
		}
		c.ttl = d.Truncate(time.Millisecond)
		return nil
	}
}

// StepDownDivisor divides the TTL into the default step-down margin, used
// when no [WithStepDown] option is given: a term ends when its lease's
// validity comes within TTL/StepDownDivisor (a quarter of the TTL), or
// within the clock-drift allowance if that is larger.
const StepDownDivisor = 4

// WithStepDown sets the step-down margin: a term ends ([Term.Done] closes,
// [Run]'s ctx ends) when its lease's validity, on the leader's clock, comes
// within d, so that the old leader has stopped believing it leads at least
// d before the lock's server can grant the lock to another candidate. It is what
// client-go's leaderelection calls the lease duration less the renew
// deadline. default: a quarter of the TTL (TTL/[StepDownDivisor]).
//
// A larger margin tolerates longer delays on the leader (a timer that fires
// late on a loaded machine, a clock that runs slow) before two candidates
// believe they lead at once; it costs nothing on a healthy leader, whose
// renewals keep the validity near the TTL, and ends a term sooner when
// renewals fail. d must be at least the clock-drift allowance [Drift] of
// the TTL and at most half the TTL (renewals go when a third of it has
// passed, and need time to arrive before the term would end); [New]
// checks it against the TTL given with [WithTTL].
func WithStepDown(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("WithStepDown", "non-positive step-down margin %v", d)
		}
		c.margin = d
		return nil
	}
}

// New returns the election called name among the candidates whose Lockers
// share l's backend (any of package lock's: Redis, a Cluster, Redlock's
// nodes, PostgreSQL, etcd). name is the lock
// resource the terms are leases of, so their fences carry it: do not lock a
// resource of the same name for anything else. New sends nothing.
//
// A nil Locker, an empty name, a name a lock resource cannot have (longer
// than [fence.MaxResourceLen], invalid UTF-8, a NUL byte, a brace) or an
// invalid option returns an error matching [fence.ErrInvalid].
func New(l *lock.Locker, name string, opts ...Option) (*Election, error) {
	if l == nil {
		return nil, invalid("New", "nil Locker")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	c := config{ttl: DefaultTTL}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	margin := c.margin
	switch {
	case margin == 0:
		margin = max(c.ttl/StepDownDivisor, Drift(c.ttl))
	case margin < Drift(c.ttl):
		return nil, invalid("WithStepDown", "step-down margin %v is below the clock-drift allowance %v of the TTL %v", margin, Drift(c.ttl), c.ttl)
	case margin > c.ttl/2:
		return nil, invalid("WithStepDown", "step-down margin %v is more than half the TTL %v: terms would end before their renewal arrives", margin, c.ttl)
	}
	rec, ok := lockbackend.Of(l).(lockbackend.Recorder)
	if !ok {
		return nil, invalid("New", "the Locker's backend keeps no record beside its locks")
	}
	tel, err := newInstruments(c.mp, c.tp)
	if err != nil {
		return nil, fmt.Errorf("election: New: telemetry: %w", err)
	}
	e := &Election{locker: l, name: name, ttl: c.ttl, margin: margin, rec: rec, tel: tel}
	// On Redis, the leader record and its channel share the lock key's
	// hash tag, so one script reads and writes both on a cluster.
	var names lock.RedisNames
	if l.As(&names) {
		base := strings.TrimSuffix(names.LockKey(name), ":lock")
		e.recordKey, e.channel = base+":leader", base+":leaders"
	}
	return e, nil
}

// Drift is the clock-drift allowance of a term with lease ttl: ttl/100 +
// 2ms, the allowance Redlock's validity rule makes for clocks that run at
// different rates. It is the least step-down margin [WithStepDown] accepts.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// StepDown returns the step-down margin (see [WithStepDown]): a term ends
// when its lease's validity comes within it.
func (e *Election) StepDown() time.Duration { return e.margin }

// Name returns the election's name, the lock resource of its terms.
func (e *Election) Name() string { return e.name }

// TTL returns the terms' lease (see [WithTTL]).
func (e *Election) TTL() time.Duration { return e.ttl }

// RedisNames names what an election on a Locker made by [lock.New] or
// [lock.NewRedlock] keeps in Redis; get them with [Election.As]. Other
// backends keep the record elsewhere (a table, an etcd key).
type RedisNames struct {
	// RecordKey is the Redis key of the election's leader record: the
	// value and token of the current term, written when it is won. It
	// shares the lock key's hash tag and lives as long as the lock, plus
	// the TTL.
	RecordKey string
	// Channel is the pub/sub channel on which each new leader is announced
	// (sharded, with SPUBLISH, on a cluster): the message is the term's
	// token, a space, and the leader's value. A value proclaimed within a
	// term ([Term.Proclaim]) is announced as the token, a dot, the count
	// of the term's record's proclaimed values, a space and the value;
	// readers of earlier releases, which parse the token alone, skip it.
	Channel string
}

// As sets target to the backend-specific view of e that it points to, and
// reports whether e has one: a *[RedisNames] for an election on a Locker
// made by [lock.New] or [lock.NewRedlock]. On any other target, or
// another backend, it returns false and leaves target unchanged.
func (e *Election) As(target any) bool {
	switch t := target.(type) {
	case *RedisNames:
		if e.recordKey == "" {
			return false
		}
		*t = RedisNames{RecordKey: e.recordKey, Channel: e.channel}
		return true
	}
	return false
}

func checkName(name string) error {
	switch {
	case name == "":
		return invalid("New", "empty name")
	case len(name) > fence.MaxResourceLen:
		return invalid("New", "name of %d bytes is longer than %d", len(name), fence.MaxResourceLen)
	case strings.ContainsAny(name, "{}"):
		return invalid("New", "name %q contains a brace, which would break its hash tag", name)
	}
	if err := (fence.Fence{Resource: name, Token: 1, Holder: "h"}).Validate(); err != nil {
		return invalid("New", "name %q: %v", name, err)
	}
	return nil
}

func checkValue(op, value string) error {
	switch {
	case value == "":
		return invalid(op, "empty value")
	case len(value) > MaxValueLen:
		return invalid(op, "value of %d bytes is longer than %d", len(value), MaxValueLen)
	case !utf8.ValidString(value):
		return invalid(op, "value is not valid UTF-8")
	case strings.ContainsRune(value, 0):
		// PostgreSQL's text cannot keep it; refused on every backend, so
		// a value that works on one works on all.
		return invalid(op, "value holds a NUL byte")
	}
	return nil
}

func checkCtx(op string, ctx context.Context) error {
	if ctx == nil {
		return invalid(op, "nil context")
	}
	return nil
}
