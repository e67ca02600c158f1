package sqlguard

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// The adapters' functions take no options, so they report through the
// global OpenTelemetry providers; instruments made from them before an SDK
// is installed forward to it once it is.
func (s *Store) instruments() {
	scope := telemetry.ScopePrefix + "storage/" + s.Name
	tp := otel.GetTracerProvider()
	if telemetry.IsDefaultGlobal(tp) {
		s.obs.idleTP = tp
	}
	s.obs.tracer = tp.Tracer(scope)
	// A counter the global provider cannot make leaves refusals uncounted;
	// the operation itself must not fail for it.
	s.obs.rejections, _ = telemetry.NewRejectionCounter(otel.GetMeterProvider().Meter(scope), s.Name)
}

// tracing reports whether a span may record: an SDK has been installed as
// the global tracer provider since the instruments were made, or was
// already. While OpenTelemetry's default global provider is still the
// global one, every span it starts is a no-op that costs a call two
// allocations (the span and the context carrying it) and the global
// tracer's bookkeeping; the calls then skip it. Once an SDK is installed
// the global provider changes, and the tracer, which delegates to the SDK
// from then on, records.
func (s *Store) tracing() bool {
	return s.obs.idleTP == nil || otel.GetTracerProvider() != s.obs.idleTP
}

// idleSpan is the span of a call made while no SDK is installed: it records
// nothing, and ending it is a no-op. The call's ctx is then left as it is:
// statements it sends see the caller's span context, as they would under
// the no-op span (which carries it), and the code that puts attributes on
// the span of ctx (trace.SpanFromContext) finds a span that does not record
// either, since ctx is left as it is only when the caller's span does not
// record.
var idleSpan trace.Span = noop.Span{}

// StartSpan begins the span of one call; f is nil for calls without a
// fence. A nil ctx is left to the call's own check.
func (s *Store) StartSpan(ctx context.Context, name string, f *fence.Fence) (context.Context, trace.Span) {
	if ctx == nil {
		return ctx, nil
	}
	s.obs.once.Do(s.instruments)
	if !s.tracing() && !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, idleSpan
	}
	ctx, span := s.obs.tracer.Start(ctx, name, telemetry.ClientSpan...)
	if f != nil {
		telemetry.FenceAttrs(span, *f)
	}
	return ctx, span
}

// EndSpan counts a refusal and ends the span with the call's outcome; a nil
// span (from a nil ctx) is left alone.
func (s *Store) EndSpan(ctx context.Context, span trace.Span, err error) {
	if span == nil {
		return
	}
	telemetry.End(span, err, s.obs.rejections.Count(ctx, err, false))
}

// FencesAttrs puts the resources and tokens of several fences on the span
// of ctx, in the order given, as the other spans carry one fence's: the
// resource and token attributes become lists. Holder ids stay out, as
// everywhere. Call it with validated fences only: span attributes must be
// valid UTF-8, which fence.Fence.Validate ensures.
func FencesAttrs(ctx context.Context, fences []fence.Fence) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	resources := make([]string, len(fences))
	tokens := make([]int64, len(fences))
	for i, f := range fences {
		resources[i], tokens[i] = f.Resource, int64(f.Token)
	}
	span.SetAttributes(telemetry.KeyResource.StringSlice(resources), telemetry.KeyToken.Int64Slice(tokens))
}
