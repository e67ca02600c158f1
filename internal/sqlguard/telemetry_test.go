package sqlguard

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// While no SDK is installed, a call's span costs nothing: no allocation,
// and the call's ctx comes back as it was given.
func TestSpanWithoutSDKAllocatesNothing(t *testing.T) {
	if !telemetry.IsDefaultGlobal(otel.GetTracerProvider()) {
		t.Skip("an SDK is installed as the global tracer provider")
	}
	s := testStore()
	ctx := context.Background()
	f := fence.Fence{Resource: "r", Token: 1 << 40, Holder: "h"}
	allocs := testing.AllocsPerRun(1000, func() {
		got, span := s.StartSpan(ctx, "fencekit.test.call", &f)
		if got != ctx {
			t.Fatal("StartSpan replaced ctx with no SDK installed")
		}
		s.EndSpan(got, span, nil)
	})
	if allocs != 0 {
		t.Fatalf("StartSpan + EndSpan: %v allocations a call with no SDK installed, want 0", allocs)
	}
}

// recordingSpan is a caller's span that records, as one from an SDK the
// caller uses without installing it as the global provider.
type recordingSpan struct{ noop.Span }

func (recordingSpan) IsRecording() bool { return true }

// Under a caller's span that records, a call still starts a span of its
// own (a no-op one while the global provider is the default), so that what
// the call puts on the span of its ctx (GuardAll's fences, Once's outcome)
// never lands on the caller's span.
func TestSpanUnderRecordingCallerSpanIsTheCallsOwn(t *testing.T) {
	if !telemetry.IsDefaultGlobal(otel.GetTracerProvider()) {
		t.Skip("an SDK is installed as the global tracer provider")
	}
	s := testStore()
	caller := recordingSpan{}
	ctx := trace.ContextWithSpan(context.Background(), caller)
	got, span := s.StartSpan(ctx, "fencekit.test.call", nil)
	defer s.EndSpan(got, span, nil)
	if _, isCaller := trace.SpanFromContext(got).(recordingSpan); isCaller {
		t.Fatal("the call's ctx carries the caller's recording span: attributes of the call would land on it")
	}
	if trace.SpanFromContext(got).IsRecording() {
		t.Fatal("the call's span records with no SDK installed")
	}
}
