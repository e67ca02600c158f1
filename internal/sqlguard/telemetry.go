package sqlguard

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// The adapters' functions take no options, so they report through the
// global OpenTelemetry providers; instruments made from them before an SDK
// is installed forward to it once it is.
func (s *Store) instruments() {
	scope := telemetry.ScopePrefix + "storage/" + s.Name
	s.obs.tracer = otel.GetTracerProvider().Tracer(scope)
	// A counter the global provider cannot make leaves refusals uncounted;
	// the operation itself must not fail for it.
	s.obs.rejections, _ = telemetry.NewRejectionCounter(otel.GetMeterProvider().Meter(scope), s.Name)
}

// StartSpan begins the span of one call; f is nil for calls without a
// fence. A nil ctx is left to the call's own check.
func (s *Store) StartSpan(ctx context.Context, name string, f *fence.Fence) (context.Context, trace.Span) {
	if ctx == nil {
		return ctx, nil
	}
	s.obs.once.Do(s.instruments)
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
