package election

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/internal/telemetry"
)

// Instrument names, in OpenTelemetry's dotted style.
const (
	// metricLeading is the number of terms this process leads now: 1 for
	// the leader of an election, 0 for the other candidates.
	metricLeading = "fencekit.election.leading"
	// metricTerms counts terms by outcome: won, resigned, lost.
	metricTerms = "fencekit.election.terms"
)

var (
	outcomeWon      = telemetry.NewOutcome("won")
	outcomeResigned = telemetry.NewOutcome("resigned")
	outcomeLost     = telemetry.NewOutcome("lost")
)

// instruments are an Election's metrics and tracer.
type instruments struct {
	tracer  trace.Tracer
	leading metric.Int64UpDownCounter
	terms   metric.Int64Counter
}

// WithMeterProvider sets where the Election's metrics go. default: the
// global provider (otel.GetMeterProvider), which records nothing until a
// program installs an SDK. The instruments: fencekit.election.leading (an
// up-down counter of the terms this process leads: whether it leads) and
// fencekit.election.terms (terms by outcome: won, resigned, lost).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return invalid("WithMeterProvider", "nil MeterProvider")
		}
		c.mp = mp
		return nil
	}
}

// WithTracerProvider sets where the Election's spans go: one per
// [Election.Campaign], from its call to the term's start, with the term's
// token. default: the global provider (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return invalid("WithTracerProvider", "nil TracerProvider")
		}
		c.tp = tp
		return nil
	}
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	const scope = telemetry.ScopePrefix + "election"
	m := mp.Meter(scope)
	in := &instruments{tracer: tp.Tracer(scope)}
	var errs [2]error
	in.leading, errs[0] = m.Int64UpDownCounter(metricLeading, metric.WithUnit("{term}"),
		metric.WithDescription("Terms this process leads now: 1 while it is an election's leader."))
	in.terms, errs[1] = m.Int64Counter(metricTerms, metric.WithUnit("{term}"),
		metric.WithDescription("Terms by outcome: won, resigned, or lost (the lease could no longer be known held)."))
	return in, errors.Join(errs[:]...)
}

func (in *instruments) startCampaign(ctx context.Context, name string) (context.Context, trace.Span) {
	ctx, span := in.tracer.Start(ctx, "fencekit.election.campaign", telemetry.ClientSpan...)
	if span.IsRecording() {
		span.SetAttributes(telemetry.String(telemetry.KeyResource, name))
	}
	return ctx, span
}

func (in *instruments) endCampaign(span trace.Span, t *Term, err error) {
	if t != nil {
		telemetry.FenceAttrs(span, t.fence)
	}
	telemetry.End(span, err, "")
}

func (in *instruments) won() {
	ctx := context.Background()
	in.leading.Add(ctx, 1)
	in.terms.Add(ctx, 1, outcomeWon.Add...)
}

func (in *instruments) ended(resigned bool) {
	ctx := context.Background()
	in.leading.Add(ctx, -1)
	if resigned {
		in.terms.Add(ctx, 1, outcomeResigned.Add...)
	} else {
		in.terms.Add(ctx, 1, outcomeLost.Add...)
	}
}
