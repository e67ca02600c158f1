package redis

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// WithMeterProvider sets where the store's metrics go (the
// fencekit.fence.rejections counter, with storage="redis"). default: the
// global provider (otel.GetMeterProvider), so a program that installs an
// OpenTelemetry SDK gets them with no option.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(s *Store) error {
		if mp == nil {
			return fmt.Errorf("%w: nil meter provider", errInvalidOption)
		}
		s.meters = mp
		return nil
	}
}

// WithTracerProvider sets where the store's spans go: one per script call,
// named fencekit.redis.<operation>, with the key, the fence's resource and
// token, and the outcome. default: the global provider
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(s *Store) error {
		if tp == nil {
			return fmt.Errorf("%w: nil tracer provider", errInvalidOption)
		}
		s.tracers = tp
		return nil
	}
}

// instruments are a store's tracer and refusal counter; nil records nothing.
type instruments struct {
	tracer     trace.Tracer
	rejections *telemetry.RejectionCounter
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	const scope = telemetry.ScopePrefix + "storage/redis"
	r, err := telemetry.NewRejectionCounter(mp.Meter(scope), "redis")
	if err != nil {
		return nil, err
	}
	return &instruments{tracer: tp.Tracer(scope), rejections: r}, nil
}

// spanNames are the span names of the script calls, made once.
var spanNames = map[string]string{
	"get": "fencekit.redis.get", "set": "fencekit.redis.set", "del": "fencekit.redis.delete",
	"load": "fencekit.redis.load", "cas-set": "fencekit.redis.compare_and_set", "cas-del": "fencekit.redis.compare_and_delete",
}

// start begins the span of one script call on key, carrying f when it is
// a fenced call.
func (in *instruments) start(ctx context.Context, op, key string, f *fence.Fence) (context.Context, trace.Span) {
	if in == nil {
		return ctx, nil
	}
	ctx, span := in.tracer.Start(ctx, spanNames[op], telemetry.ClientSpan...)
	if span.IsRecording() {
		span.SetAttributes(telemetry.String(telemetry.KeyKey, key))
		if f != nil {
			telemetry.FenceAttrs(span, *f)
		}
	}
	return ctx, span
}

// end counts a refusal and ends the span with the call's outcome.
func (in *instruments) end(ctx context.Context, span trace.Span, err error) {
	if in == nil {
		return
	}
	reason := in.rejections.Count(ctx, err, errors.Is(err, ErrResourceMismatch))
	telemetry.End(span, err, reason)
}
