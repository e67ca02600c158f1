package mysql

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// The package's functions take no options, so they report through the
// global OpenTelemetry providers; instruments made from them before an SDK
// is installed forward to it once it is.
var obs struct {
	once       sync.Once
	tracer     trace.Tracer
	rejections *telemetry.RejectionCounter
}

func instruments() {
	const scope = telemetry.ScopePrefix + "storage/mysql"
	obs.tracer = otel.GetTracerProvider().Tracer(scope)
	// A counter the global provider cannot make leaves refusals uncounted;
	// the operation itself must not fail for it.
	obs.rejections, _ = telemetry.NewRejectionCounter(otel.GetMeterProvider().Meter(scope), "mysql")
}

// startSpan begins the span of one call; f is nil for calls without a
// fence. A nil ctx is left to the call's own check.
func startSpan(ctx context.Context, name string, f *fence.Fence) (context.Context, trace.Span) {
	if ctx == nil {
		return ctx, nil
	}
	obs.once.Do(instruments)
	ctx, span := obs.tracer.Start(ctx, name, telemetry.ClientSpan...)
	if f != nil {
		telemetry.FenceAttrs(span, *f)
	}
	return ctx, span
}

// fencesAttrs puts the resources and tokens of several fences on the span of
// ctx, in the order given, as lists; holder ids stay out. Call it with
// validated fences only: span attributes must be valid UTF-8.
func fencesAttrs(ctx context.Context, fences []fence.Fence) {
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

// endSpan counts a refusal and ends the span with the call's outcome.
func endSpan(ctx context.Context, span trace.Span, err error) {
	if span == nil {
		return
	}
	telemetry.End(span, err, obs.rejections.Count(ctx, err, false))
}
