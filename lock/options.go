package lock

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// DefaultPrefix is the key prefix used when no [WithPrefix] option is given.
const DefaultPrefix = "fencekit:"

// Option configures a [Locker]. Options validate themselves: [New] returns
// their error instead of building a Locker.
type Option func(*config) error

type config struct {
	prefix    string
	wait      WaitStrategy
	poll      bool
	retention time.Duration
	perNode   time.Duration
	meters    metric.MeterProvider
	tracers   trace.TracerProvider
	given     lockbackend.Given // the options the caller set, for the backend
}

// instruments makes the Locker's OpenTelemetry instruments on the chosen
// providers, the global ones by default.
func (c config) instruments() (*instruments, error) {
	mp, tp := c.meters, c.tracers
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return newInstruments(mp, tp)
}

// WithMeterProvider sets where the Locker's metrics go. default: the global
// provider (otel.GetMeterProvider), so a program that installs an
// OpenTelemetry SDK gets them with no option and one that does not pays
// next to nothing. See the package doc for the instruments.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return fmt.Errorf("%w: nil meter provider", errInvalid)
		}
		c.meters = mp
		return nil
	}
}

// WithTracerProvider sets where the Locker's spans go. default: the global
// provider (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return fmt.Errorf("%w: nil tracer provider", errInvalid)
		}
		c.tracers = tp
		return nil
	}
}

// DefaultTokenRetention is how long a resource's token state outlives its
// last lease when no [WithTokenRetention] option is given.
const DefaultTokenRetention = 10 * time.Minute

// WithTokenRetention sets how long a resource's token state stays in Redis
// after its last grant's lease ends. default: [DefaultTokenRetention].
//
// Tokens are max(previous token + 1, the Redis server's clock in
// microseconds), so they keep increasing after the state has expired, as
// long as the server's clock has not gone back past the last token issued.
// The retention is therefore how far back the clock may step (an NTP step,
// a restored VM) while a resource is idle without its next token being
// refused by storage; safety never depends on it, since storage refuses an
// older token whatever happens. Longer retention costs memory: about 170
// bytes per resource locked within the window. d must be between 1ms and
// [MaxTTL].
func WithTokenRetention(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > MaxTTL {
			return fmt.Errorf("%w: token retention %v is outside [1ms, %v]", errInvalid, d, MaxTTL)
		}
		c.retention = d
		c.given |= lockbackend.GivenRetention
		return nil
	}
}

// WithPrefix sets the prefix of every key the Locker writes.
// default: "fencekit:". It must not contain '{' or '}', which would change
// the hash tags that keep a resource's keys in one Redis Cluster slot.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: prefix %q contains a brace", errInvalid, prefix)
		}
		c.prefix = prefix
		c.given |= lockbackend.GivenPrefix
		return nil
	}
}

// WithWait makes [Locker.Acquire] poll: after each refused attempt it
// sleeps as w says, never past the current holder's remaining lease; it
// subscribes to nothing and does not join the wait queue, so it takes the
// lock only when it is free and no live waiter of another Locker is queued
// (a free lock goes to the first of those). default: wait in the queue for a release's
// grant (pub/sub) and retry on Backoff(time.Millisecond, 64*time.Millisecond)
// only while the subscription is down.
func WithWait(w WaitStrategy) Option {
	return func(c *config) error {
		if w == nil {
			return fmt.Errorf("%w: nil wait strategy", errInvalid)
		}
		c.wait = w
		c.poll = true
		c.given |= lockbackend.GivenWait
		return nil
	}
}

// WaitStrategy decides how long [Locker.Acquire] sleeps after a refused
// attempt. Implementations must be safe for concurrent use.
type WaitStrategy interface {
	// Delay returns the pause after the attempt-th refusal (attempt starts
	// at 0). remaining is the current holder's remaining lease, or negative
	// when unknown; Acquire never sleeps longer than a known remaining lease.
	Delay(attempt int, remaining time.Duration) time.Duration
}

// Backoff returns a [WaitStrategy] of exponential backoff with full jitter:
// after the n-th refusal it sleeps a uniformly random time in
// [0, min(max, min·2ⁿ)]. Jitter keeps waiters from retrying in lock step.
// Non-positive or inverted bounds fall back to the defaults.
func Backoff(min, max time.Duration) WaitStrategy {
	if min <= 0 || max < min {
		min, max = time.Millisecond, 64*time.Millisecond
	}
	return backoff{min: min, max: max}
}

type backoff struct{ min, max time.Duration }

func (b backoff) Delay(attempt int, _ time.Duration) time.Duration {
	// min·2ⁿ saturates at max: doubling stops as soon as it would pass max,
	// so no shift can overflow whatever min and the attempt are.
	ceiling := b.min
	for i := 0; i < attempt && ceiling < b.max; i++ {
		if ceiling > b.max/2 {
			ceiling = b.max
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, b.max)
	if ceiling == math.MaxInt64 { // ceiling+1 would wrap
		return ceiling
	}
	return rand.N(ceiling + 1)
}
