// Package telemetry holds what the lock and the storage adapters share for
// OpenTelemetry: instrument names and units, precomputed attribute sets (so
// recording allocates nothing), and helpers that end spans with an outcome.
// It is internal: users choose providers through each package's options.
package telemetry

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
)

// ScopePrefix starts the instrumentation scope name of every package.
const ScopePrefix = "github.com/fencekit/fencekit/"

// Instrument names, in OpenTelemetry's dotted style.
const (
	AcquireDuration = "fencekit.lock.acquire.duration"
	HoldDuration    = "fencekit.lock.hold.duration"
	Waiters         = "fencekit.lock.waiters"
	Lost            = "fencekit.lock.lost"
	Renewals        = "fencekit.lock.renewals"
	Rejections      = "fencekit.fence.rejections"
	// TokenStateMisses counts grants that found no token state.
	TokenStateMisses = "fencekit.lock.token_state.misses"
)

// Attribute keys on metrics (low cardinality) and spans.
const (
	KeyOutcome  = attribute.Key("outcome")
	KeyStorage  = attribute.Key("storage")
	KeyReason   = attribute.Key("reason")
	KeyResource = attribute.Key("fencekit.resource")
	KeyToken    = attribute.Key("fencekit.token")
	KeyKey      = attribute.Key("fencekit.key")
	// KeyOnceRan says on a Once span whether the call ran its work.
	KeyOnceRan = attribute.Key("fencekit.once.ran")
)

// Outcome is a precomputed attribute set with one outcome, for metric
// options that allocate nothing when recorded.
type Outcome struct {
	Name string
	// Record and Add are the options of a measurement with this outcome, as
	// slices made once: passing them with ... allocates nothing.
	Record []metric.RecordOption
	Add    []metric.AddOption
}

// NewOutcome returns the Outcome for name.
func NewOutcome(name string) Outcome {
	opt := metric.WithAttributeSet(attribute.NewSet(KeyOutcome.String(name)))
	return Outcome{Name: name, Record: []metric.RecordOption{opt}, Add: []metric.AddOption{opt}}
}

// IsDefaultGlobal reports whether p is one of OpenTelemetry's default
// global providers (otel.GetTracerProvider, otel.GetMeterProvider before a
// program installs its own), which delegate to an SDK once one is installed
// and record nothing before. A provider of any other type counts as
// recording.
func IsDefaultGlobal(p any) bool {
	t := reflect.TypeOf(p)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// ClientSpan is the start option of every span: a client call.
var ClientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// Rejection reasons of fencekit.fence.rejections.
const (
	ReasonStale            = "stale"
	ReasonConflict         = "conflict"
	ReasonResourceMismatch = "resource_mismatch"
)

// RejectionCounter counts a storage adapter's refusals by reason, with
// precomputed attribute sets.
type RejectionCounter struct {
	c                          metric.Int64Counter
	stale, conflict, resources []metric.AddOption
}

// NewRejectionCounter makes the fencekit.fence.rejections counter of meter
// for storage ("postgres", "redis").
func NewRejectionCounter(meter metric.Meter, storage string) (*RejectionCounter, error) {
	c, err := meter.Int64Counter(Rejections, metric.WithUnit("{rejection}"),
		metric.WithDescription("Operations that storage refused: a stale fence (a newer holder was admitted), a version conflict, or a fence for another resource."))
	if err != nil {
		return nil, err
	}
	opt := func(reason string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(KeyStorage.String(storage), KeyReason.String(reason)))}
	}
	return &RejectionCounter{c: c, stale: opt(ReasonStale), conflict: opt(ReasonConflict), resources: opt(ReasonResourceMismatch)}, nil
}

// Count records err if it is a refusal (stale or conflict; resourceMismatch
// says whether err is a resource mismatch, which only the caller's package
// can tell). It returns the reason, or "" when err is not a refusal.
func (r *RejectionCounter) Count(ctx context.Context, err error, resourceMismatch bool) string {
	if r == nil || err == nil {
		return ""
	}
	switch {
	case errors.Is(err, fence.ErrStale):
		r.c.Add(ctx, 1, r.stale...)
		return ReasonStale
	case errors.Is(err, fence.ErrConflict):
		r.c.Add(ctx, 1, r.conflict...)
		return ReasonConflict
	case resourceMismatch:
		r.c.Add(ctx, 1, r.resources...)
		return ReasonResourceMismatch
	}
	return ""
}

// End ends span with err: a refusal (reason not empty) is recorded as the
// span's outcome and error, any other error as the span's error. Error texts
// go out as valid UTF-8 (see [Sanitize]).
func End(span trace.Span, err error, reason string) {
	if span.IsRecording() {
		switch {
		case err == nil:
			span.SetAttributes(KeyOutcome.String("ok"))
		case reason != "":
			span.SetAttributes(KeyOutcome.String(reason))
			recordError(span, err)
			span.SetStatus(codes.Error, reason)
		default:
			span.SetAttributes(KeyOutcome.String("error"))
			recordError(span, err)
			span.SetStatus(codes.Error, Sanitize(err.Error()))
		}
	}
	span.End()
}

// recordError records err on span as an exception event, as
// span.RecordError does, with its message made valid UTF-8.
func recordError(span trace.Span, err error) {
	msg := err.Error()
	if utf8.ValidString(msg) {
		span.RecordError(err)
		return
	}
	span.AddEvent("exception", trace.WithAttributes(
		attribute.String("exception.type", reflect.TypeOf(err).String()),
		attribute.String("exception.message", Sanitize(msg)),
	))
}

// FenceAttrs puts a fence on a recording span: its resource and token,
// never its holder (a lock's holder id is what releases the lock).
func FenceAttrs(span trace.Span, f fence.Fence) {
	if span.IsRecording() {
		span.SetAttributes(String(KeyResource, f.Resource), KeyToken.Int64(int64(f.Token)))
	}
}

// String returns a string attribute whose value is v made valid UTF-8 (see
// [Sanitize]). Every string attribute of a span goes through it: keys and
// resources may hold any bytes, and one invalid string makes an OTLP
// exporter drop the whole batch it belongs to.
func String(k attribute.Key, v string) attribute.KeyValue {
	return k.String(Sanitize(v))
}

// Sanitize returns s unchanged when it is valid UTF-8, and otherwise s with
// every byte that does not belong to a valid UTF-8 sequence written as \xNN,
// so that distinct binary keys stay distinct and readable.
func Sanitize(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			b.WriteString(`\x`)
			b.WriteByte(hex[s[i]>>4])
			b.WriteByte(hex[s[i]&0xf])
			i++
			continue
		}
		b.WriteString(s[i : i+n])
		i += n
	}
	return b.String()
}
