package lock

import (
	"context"
	"errors"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// Outcomes of acquisitions and renewals, as metric attributes. Resource
// names and tokens go on spans only: as metric attributes they would make
// one time series per resource.
var (
	outcomeAcquired    = telemetry.NewOutcome("acquired")
	outcomeNotAcquired = telemetry.NewOutcome("not_acquired")
	outcomeCancelled   = telemetry.NewOutcome("cancelled")
	outcomeError       = telemetry.NewOutcome("error")
	outcomeRenewed     = telemetry.NewOutcome("renewed")
	outcomeRefused     = telemetry.NewOutcome("refused")
)

// instruments are a Locker's metrics and tracer. A nil *instruments records
// nothing, which is how the overhead benchmark runs without them.
type instruments struct {
	tracer trace.Tracer
	// idleTP and idleMP are OpenTelemetry's default global providers, kept
	// when the Locker took its instruments from them: while they are still
	// the global ones no SDK is installed, so every span would be a no-op
	// and every measurement dropped, and the hot path skips them (their
	// allocations were a measurable part of an uncontended acquire +
	// release). Once a program installs an SDK the global providers change,
	// and the instruments, which delegate to the SDK from then on, record.
	// nil when a provider was given or an SDK was already installed.
	idleTP   trace.TracerProvider
	idleMP   metric.MeterProvider
	acquire  metric.Float64Histogram
	hold     metric.Float64Histogram
	waiters  metric.Int64UpDownCounter
	lost     metric.Int64Counter
	renewals metric.Int64Counter
	misses   metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) (*instruments, error) {
	const scope = telemetry.ScopePrefix + "lock"
	m := mp.Meter(scope)
	in := &instruments{tracer: tp.Tracer(scope)}
	if isDefaultGlobal(tp) {
		in.idleTP = tp
	}
	if isDefaultGlobal(mp) {
		in.idleMP = mp
	}
	var errs [6]error
	in.acquire, errs[0] = m.Float64Histogram(telemetry.AcquireDuration, metric.WithUnit("s"),
		metric.WithDescription("Time TryAcquire and Acquire took, waiting included, by outcome."))
	in.hold, errs[1] = m.Float64Histogram(telemetry.HoldDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a grant to its release or loss."))
	in.waiters, errs[2] = m.Int64UpDownCounter(telemetry.Waiters, metric.WithUnit("{waiter}"),
		metric.WithDescription("Callers inside Acquire, waiting for a lock."))
	in.lost, errs[3] = m.Int64Counter(telemetry.Lost, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases found lost while held: expired, taken over, or refused on renewal."))
	in.renewals, errs[4] = m.Int64Counter(telemetry.Renewals, metric.WithUnit("{renewal}"),
		metric.WithDescription("Automatic renewals of leases, by outcome: renewed, refused (the lease was lost) or error."))
	in.misses, errs[5] = m.Int64Counter(telemetry.TokenStateMisses, metric.WithUnit("{grant}"),
		metric.WithDescription("Grants that found no token state in Redis, so their token came from the server clock: a resource's first grant within the token retention, or state that Redis lost."))
	return in, errors.Join(errs[:]...)
}

// isDefaultGlobal reports whether p is one of OpenTelemetry's default
// global providers, which delegate to an SDK once one is installed and
// record nothing before. A provider of any other type counts as recording.
func isDefaultGlobal(p any) bool {
	t := reflect.TypeOf(p)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// tracing reports whether spans may record: a provider was given, or an
// SDK has been installed as the global one since the Locker was made.
func (in *instruments) tracing() bool {
	return in.idleTP == nil || otel.GetTracerProvider() != in.idleTP
}

// metering reports whether measurements may be kept, as tracing does for
// spans.
func (in *instruments) metering() bool {
	return in.idleMP == nil || otel.GetMeterProvider() != in.idleMP
}

// startAcquire starts the span of an acquisition and counts a waiter when
// the caller may wait.
func (in *instruments) startAcquire(ctx context.Context, name, resource string, waiting bool) (context.Context, trace.Span) {
	if in == nil {
		return ctx, nil
	}
	if waiting {
		in.waiters.Add(ctx, 1)
	}
	if !in.tracing() {
		return ctx, nil
	}
	ctx, span := in.tracer.Start(ctx, name, telemetry.ClientSpan...)
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyResource.String(resource))
	}
	return ctx, span
}

// endAcquire records an acquisition that started at start.
func (in *instruments) endAcquire(ctx context.Context, span trace.Span, start time.Time, waiting bool, lease *Lease, err error) {
	if in == nil {
		return
	}
	if waiting {
		in.waiters.Add(ctx, -1)
	}
	o := outcomeAcquired
	switch {
	case err == nil:
	case errors.Is(err, ErrNotAcquired):
		o = outcomeNotAcquired
	case ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		o = outcomeCancelled
	default:
		o = outcomeError
	}
	if in.metering() {
		in.acquire.Record(ctx, time.Since(start).Seconds(), o.Record...)
	}
	if span == nil {
		return
	}
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyOutcome.String(o.Name))
		if lease != nil {
			span.SetAttributes(telemetry.KeyToken.Int64(int64(lease.f.Token)))
		}
		if o.Name == outcomeError.Name {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// ended records the end of a lease granted at granted: its hold time, and
// a loss unless it ended by this lease's own release.
func (in *instruments) ended(granted time.Time, err error) {
	if in == nil {
		return
	}
	ctx := context.Background()
	if in.metering() {
		in.hold.Record(ctx, time.Since(granted).Seconds())
	}
	if !errors.Is(err, ErrReleased) {
		in.lost.Add(ctx, 1)
	}
}

// stateMissed records a grant that found no token state.
func (in *instruments) stateMissed(ctx context.Context) {
	if in == nil || !in.metering() {
		return
	}
	in.misses.Add(ctx, 1)
}

// renewed records one automatic renewal's outcome.
func (in *instruments) renewed(err error) {
	if in == nil {
		return
	}
	o := outcomeRenewed
	switch {
	case errors.Is(err, ErrNotHeld):
		o = outcomeRefused
	case err != nil:
		o = outcomeError
	}
	in.renewals.Add(context.Background(), 1, o.Add...)
}

// startLeaseOp starts the span of an operation on a lease.
func (in *instruments) startLeaseOp(ctx context.Context, name string, f fence.Fence) (context.Context, trace.Span) {
	if in == nil || !in.tracing() {
		return ctx, nil
	}
	ctx, span := in.tracer.Start(ctx, name, telemetry.ClientSpan...)
	telemetry.FenceAttrs(span, f)
	return ctx, span
}

// endLeaseOp ends a lease operation's span.
func (in *instruments) endLeaseOp(span trace.Span, err error) {
	if in == nil || span == nil {
		return
	}
	reason := ""
	if errors.Is(err, ErrNotHeld) {
		reason = "not_held"
	}
	telemetry.End(span, err, reason)
}
