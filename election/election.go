package election

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockaccess"
	"github.com/fencekit/fencekit/lock"
)

// DefaultTTL is a term's lease when no [WithTTL] option is given: how long a
// leader that crashed or was cut off keeps the election before another
// candidate can win it.
const DefaultTTL = 10 * time.Second

// MaxValueLen is the longest value, in bytes, a candidate may campaign with.
const MaxValueLen = 4096

// Election is one named election among candidates that share a Redis
// deployment through their [lock.Locker]s. It is safe for concurrent use:
// a process may campaign, read the leader and observe at once.
type Election struct {
	locker *lock.Locker
	name   string
	ttl    time.Duration
	margin time.Duration // the drift allowance: a term ends this long before its lease's validity runs out

	nodes   []lockaccess.Node
	quorum  int
	timeout time.Duration // the node timeout under Redlock, 0 on one node
	sharded string        // "1" when announcements use SPUBLISH (a cluster)

	lockKey, recordKey, channel string

	tel *instruments
}

// Option configures an [Election]. Options validate themselves: [New]
// returns their error instead of an Election.
type Option func(*config) error

type config struct {
	ttl time.Duration
	mp  metric.MeterProvider
	tp  trace.TracerProvider
}

// WithTTL sets the term's lease: the lock is renewed automatically while
// the leader lives and is connected, so d is how long a crashed or cut-off
// leader keeps the election, not how long a term lasts. default:
// [DefaultTTL]. d must be at least 10ms and at most [lock.MaxTTL]; Redis
// keeps whole milliseconds, so a fraction of one is dropped.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("WithTTL", "non-positive TTL %v", d)
		}
		if d < 10*time.Millisecond {
			return invalid("WithTTL", "TTL %v is shorter than 10ms, too short to renew a lease in", d)
		}
		if d > lock.MaxTTL {
			return invalid("WithTTL", "TTL %v is longer than %v", d, lock.MaxTTL)
		}
		c.ttl = d.Truncate(time.Millisecond)
		return nil
	}
}

// New returns the election called name among the candidates of l's Redis
// deployment (one server, a Cluster, or Redlock's nodes). name is the lock
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
	nodes, quorum, timeout := lockaccess.Nodes(l)
	if len(nodes) == 0 {
		return nil, invalid("New", "the Locker has no Redis client")
	}
	tel, err := newInstruments(c.mp, c.tp)
	if err != nil {
		return nil, fmt.Errorf("election: New: telemetry: %w", err)
	}
	e := &Election{locker: l, name: name, ttl: c.ttl, margin: Drift(c.ttl), nodes: nodes, quorum: quorum, timeout: timeout, tel: tel}
	if _, ok := nodes[0].Client.(*redis.ClusterClient); ok {
		e.sharded = "1"
	}
	// The leader record and its channel share the lock key's hash tag, so
	// one script reads and writes both on a cluster.
	e.lockKey = l.LockKey(name)
	base := strings.TrimSuffix(e.lockKey, ":lock")
	e.recordKey, e.channel = base+":leader", base+":leaders"
	return e, nil
}

// Drift is the clock-drift allowance of a term with lease ttl: ttl/100 +
// 2ms, the allowance Redlock's validity rule makes for clocks that run at
// different rates. A term ends this long before its lease's validity runs
// out (see the package doc).
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Name returns the election's name, the lock resource of its terms.
func (e *Election) Name() string { return e.name }

// TTL returns the terms' lease (see [WithTTL]).
func (e *Election) TTL() time.Duration { return e.ttl }

// RecordKey returns the Redis key of the election's leader record: the
// value and token of the current term, written when it is won. It shares
// the lock key's hash tag and lives as long as the lock, plus the TTL.
func (e *Election) RecordKey() string { return e.recordKey }

// Channel returns the pub/sub channel on which each new leader is
// announced (sharded, with SPUBLISH, on a cluster): the message is the
// term's token, a space, and the leader's value.
func (e *Election) Channel() string { return e.channel }

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
	}
	return nil
}

func checkCtx(op string, ctx context.Context) error {
	if ctx == nil {
		return invalid(op, "nil context")
	}
	return nil
}
